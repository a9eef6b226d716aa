"""`llmfleet_gateway_guardrail_decisions_total`: one per decision, by team id, direction, check and
action, on the registry it is given."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from apps.core.guardrails.decisions import Decision
from apps.core.guardrails.metrics import GuardrailMetrics

pytestmark = pytest.mark.timeout(30)


def test_decisions_are_counted_by_team_id_direction_check_and_action() -> None:
    registry = CollectorRegistry()
    metrics = GuardrailMetrics(registry)
    metrics.count(
        7,
        [
            Decision("input", "ssn", "redact", "messages.0.content"),
            Decision("input", "ssn", "redact", "messages.1.content"),
            Decision("output", "member_id", "block", "choices.0"),
        ],
    )
    metrics.count(None, [Decision("input", "guard_model", "flag", "messages")])

    def value(team: str, direction: str, check: str, action: str) -> float | None:
        labels = {"team": team, "direction": direction, "check": check, "action": action}
        return registry.get_sample_value("llmfleet_gateway_guardrail_decisions_total", labels)

    assert value("7", "input", "ssn", "redact") == 2
    assert value("7", "output", "member_id", "block") == 1
    assert value("", "input", "guard_model", "flag") == 1
    assert value("7", "output", "ssn", "redact") is None
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        GuardrailMetrics(registry)  # once per registry: the wiring builds it once
