"""Per-team service counters of the fair queue (tokens served per model and team), without I/O.

The orchestrator's `TeamService` adds the Redis sync that shares them across replicas; the
simulator uses them as they are (one queue).
"""

from __future__ import annotations

from collections import defaultdict


class TeamCounters:
    def __init__(self) -> None:
        self._totals: dict[str, dict[int, float]] = {}  # model -> team -> tokens, as of the last sync
        self._pending: defaultdict[tuple[str, int], float] = defaultdict(float)
        self._interactive_elsewhere: dict[str, int] = {}

    def served(self, model: str, team: int) -> float:
        """Tokens served to `team` on `model` by every replica (last sync + this replica's since)."""
        return self._totals.get(model, {}).get(team, 0.0) + self._pending.get((model, team), 0.0)

    def charge(self, model: str, team: int, tokens: float) -> None:
        self._pending[(model, team)] += tokens

    def interactive_elsewhere(self, model: str) -> bool:
        return self._interactive_elsewhere.get(model, 0) > 0
