"""The guardrails' metric: `llmfleet_gateway_guardrail_decisions_total{team, direction, check, action}`,
one per decision (each match of a check, each guard model verdict that acted). `team` is the team's id,
as every per-team metric of the platform (docs/security.md: never its name); `check` is a built-in
detector, a team pattern's name or `guard_model`. Registered on the registry it is given (the gateway's
`GatewayDeps.registry`), once per process."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter

from apps.core.guardrails.decisions import Decision


class GuardrailMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = Counter(
            "llmfleet_gateway_guardrail_decisions",
            "Guardrail decisions by team id, direction (input, output), check and action (redact, block, flag)",
            ["team", "direction", "check", "action"],
            registry=registry,
        )

    def count(self, team_id: int | None, decisions: Iterable[Decision]) -> None:
        team = "" if team_id is None else str(team_id)
        for decision in decisions:
            self.decisions.labels(team, decision.direction, decision.check, decision.action).inc()
