"""The console's response cache panel (docs/console.md): hits, misses, hit rate, the credits paid for the
hits and the GPU time they saved, per model in the team view and per team in the admin view, over UTC days.

Everything comes from the daily rollup (`UsageRollups.cache_use`: the ledger's `cache` column and the
semantic lookups' `:cache-embed` rows, migration 0018), so it covers any range the usage charts show and a
key-scoped session sees its key's only. The GPU time saved is the hits' completion tokens times the model's
planning figure (a replica's GPUs over its decode tokens/s, `apps.gateway.caching.gpu_seconds_per_token`),
the figure by which the gateway counts `llmfleet_gateway_cache_saved_gpu_seconds_total`: an estimate at the
stack's figures, not a measurement.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import date

from apps.core.ledger.rollups import CacheUse, UsageRollups
from apps.gateway.caching import gpu_seconds_per_token
from apps.gateway.console.forms import UsageQuery, usage_query
from apps.gateway.deps import GatewayDeps


@dataclass(frozen=True)
class CacheLine:
    """One row of the panel: a model (team view), a team (admin view) or the total."""

    key: str  # the model's name, the team's id, or "total"
    label: str
    hits: int = 0
    misses: int = 0
    hit_microcredits: int = 0
    hit_tokens: int = 0  # completion tokens answered from the cache
    gpu_seconds: float = 0.0
    lookups: int = 0  # semantic lookups (question embeddings)
    lookup_microcredits: int = 0

    @property
    def hit_rate(self) -> float | None:
        """hits / (hits + misses); None when the cache was not asked."""
        asked = self.hits + self.misses
        return self.hits / asked if asked else None

    def plus(self, other: CacheLine) -> CacheLine:
        return replace(
            self,
            hits=self.hits + other.hits,
            misses=self.misses + other.misses,
            hit_microcredits=self.hit_microcredits + other.hit_microcredits,
            hit_tokens=self.hit_tokens + other.hit_tokens,
            gpu_seconds=self.gpu_seconds + other.gpu_seconds,
            lookups=self.lookups + other.lookups,
            lookup_microcredits=self.lookup_microcredits + other.lookup_microcredits,
        )


@dataclass(frozen=True)
class CachePanel:
    by: str  # what a line is: "Model" or "Team"
    start: date
    end: date  # inclusive, like the usage range's "to"
    lines: list[CacheLine]
    total: CacheLine


def line_of(row: CacheUse, key: str, label: str, gpu_s_per_token: Mapping[str, float]) -> CacheLine:
    return CacheLine(
        key=key,
        label=label,
        hits=row.hits,
        misses=row.misses,
        hit_microcredits=row.hit_cost_microcredits,
        hit_tokens=row.hit_completion_tokens,
        gpu_seconds=row.hit_completion_tokens * gpu_s_per_token.get(row.model, 0.0),
        lookups=row.lookups,
        lookup_microcredits=row.lookup_cost_microcredits,
    )


def panel(
    by: str,
    rows: Iterable[CacheUse],
    start: date,
    end: date,
    gpu_s_per_token: Mapping[str, float],
    group: Callable[[CacheUse], tuple[str, str]],
) -> CachePanel:
    """The rows folded by `group` (a row's key and label), in label order, and their total."""
    lines: dict[str, CacheLine] = {}
    for row in rows:
        key, label = group(row)
        line = line_of(row, key, label, gpu_s_per_token)
        lines[key] = lines[key].plus(line) if key in lines else line
    total = CacheLine("total", "Total")
    for line in lines.values():
        total = total.plus(line)
    return CachePanel(by, start, end, sorted(lines.values(), key=lambda x: (x.label, x.key)), total)


def gpu_time(seconds: float) -> str:
    """GPU time for a person: seconds under 2 minutes, minutes under 2 hours, then hours."""

    def number(value: float) -> str:
        return f"{value:.3g}" if value < 100 else f"{value:,.0f}"

    if seconds < 120:
        return f"{number(seconds)} GPU-s"
    if seconds < 7200:
        return f"{number(seconds / 60)} GPU-min"
    return f"{number(seconds / 3600)} GPU-h"


class CacheReport:
    """The panel of a team (its usage range, its key's only in a key-scoped session) or of every team
    (the console's default range)."""

    def __init__(self, deps: GatewayDeps, usage: Callable[[], UsageRollups]) -> None:
        self.deps = deps
        self.usage = usage  # the console's store (a Problem when it is not configured)
        self.gpu_s_per_token = gpu_seconds_per_token(deps.spec)

    async def team(self, team_id: int, query: UsageQuery, key_id: int | None) -> CachePanel:
        rows = await self.usage().cache_use(
            team_id, query.start, query.end_exclusive, key_id=key_id, model=query.model
        )
        return panel(
            "Model", rows, query.start, query.end, self.gpu_s_per_token, lambda r: (r.model, r.model)
        )

    async def teams(self, names: Mapping[int, str]) -> CachePanel:
        query = usage_query(
            {}, (), self.deps.clock().date()
        )  # the usage range's default: the last 30 UTC days
        rows = await self.usage().cache_use(None, query.start, query.end_exclusive)
        return panel(
            "Team",
            rows,
            query.start,
            query.end,
            self.gpu_s_per_token,
            lambda r: (str(r.team_id), names.get(r.team_id, f"team {r.team_id}")),
        )
