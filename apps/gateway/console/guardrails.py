"""The console's guardrail decisions panel (docs/console.md): how often the checks of a team's guardrail
policy redacted, blocked or flagged, per direction, check and action in the team view (over its usage
range) and per team in the admin view (the console's default range), over UTC days.

The counts are the gateway's (`apps.gateway.decision_counts`, at each request's end) in Redis
(`apps.core.guardrails.counts.DecisionCounts`): per team and day, so not per key or model (a key-scoped
session sees its team's, and the page says so; the model filter does not apply), kept 367 days. Only
counts: what a check matched is never stored, so nothing of it can be shown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import date

from apps.core.errors import StoreUnavailable
from apps.core.guardrails.counts import DecisionCount
from apps.gateway.console.forms import UsageQuery, usage_query
from apps.gateway.deps import GatewayDeps

ACTIONS = ("redact", "block", "flag")


@dataclass(frozen=True)
class DecisionLine:
    """One row: a team's (admin view) or the team's (team view) direction, check and action."""

    key: str  # the row's id: `[<team id>-]<direction>-<check>-<action>`
    team: str  # the team's name in the admin view, "" in the team view
    direction: str
    check: str
    action: str
    count: int


@dataclass(frozen=True)
class DecisionPanel:
    start: date
    end: date  # inclusive, like the usage range's "to"
    lines: list[DecisionLine]
    by_action: dict[str, int]  # redact, block, flag: the range's totals
    total: int
    kept_since: date | None  # set when the range starts before the first day still kept


def decision_panel(
    counts: Iterable[DecisionCount],
    start: date,
    end: date,
    kept_since: date,
    team: Callable[[int], str] | None,
) -> DecisionPanel:
    """The rows in (team name, direction, check, action) order and their totals; `team` names a team
    id (the admin view), None in the team view."""
    lines = [
        DecisionLine(
            key="-".join([*([str(c.team_id)] if team is not None else []), c.direction, c.check, c.action]),
            team=team(c.team_id or 0) if team is not None else "",
            direction=c.direction,
            check=c.check,
            action=c.action,
            count=c.count,
        )
        for c in counts
    ]
    lines.sort(key=lambda x: (x.team, x.key))
    by_action = {a: sum(x.count for x in lines if x.action == a) for a in ACTIONS}
    return DecisionPanel(
        start,
        end,
        lines,
        by_action,
        sum(x.count for x in lines),
        kept_since if start < kept_since else None,
    )


class GuardrailReport:
    """The panel of a team (its usage range) or of every team; None when the counts are not wired or
    Redis does not answer (the page still renders and says so)."""

    def __init__(self, deps: GatewayDeps) -> None:
        self.deps = deps

    async def team(self, team_id: int, query: UsageQuery) -> DecisionPanel | None:
        store = self.deps.guardrail_counts
        if store is None:
            return None
        try:
            counts = await store.team(team_id, query.start, query.end_exclusive)
        except StoreUnavailable:
            return None
        return decision_panel(counts, query.start, query.end, store.kept_since(), None)

    async def teams(self, names: Mapping[int, str]) -> DecisionPanel | None:
        store = self.deps.guardrail_counts
        if store is None:
            return None
        query = usage_query({}, (), self.deps.clock().date())  # the default: the last 30 UTC days
        try:
            counts = await store.teams(query.start, query.end_exclusive)
        except StoreUnavailable:
            return None
        return decision_panel(
            counts, query.start, query.end, store.kept_since(), lambda t: names.get(t, f"team {t}")
        )
