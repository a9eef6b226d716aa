"""Per-team service counters shared by every orchestrator replica, with local decisions.

The counters are `apps.core.scheduling.service.TeamCounters` (shared with `llmfleet simulate`).
Each replica charges the tokens it hands slots to (prompt + expected answer, corrected with the
engine's usage when the request ends) to a local pending delta; `sync` — once per fleet refresh,
one Redis pipeline, never per dispatch — adds the deltas to `fair:svc:{model}`, reads the totals
back, and publishes this replica's waiting lanes in `fair:q:{model}` (`apps.core.fairboard`),
which other replicas read to hold batch back while interactive requests wait anywhere, and what `GET /admin/queues` shows. A replica's view of another replica's
service is at most one refresh interval old; `docs/control-plane.md` derives the tolerance.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from redis.asyncio import Redis

from apps.core.clock import SYSTEM
from apps.core.fairboard import QUEUE_KEY, QUEUE_TTL_S, SVC_KEY, SVC_TTL_S, lanes_waiting, published, text_map
from apps.core.scheduling.service import TeamCounters
from apps.core.sharing import PriorityClass

# (class, team) -> (waiting, the oldest one's wait in seconds)
LaneCounts = Mapping[tuple[PriorityClass, int], tuple[int, float]]


class TeamService(TeamCounters):
    """`TeamCounters` (`apps.core.scheduling.service`) shared across replicas through Redis."""

    def __init__(self, replica_id: str = "", wall_clock: Callable[[], float] = SYSTEM.wall) -> None:
        super().__init__()
        self.replica_id = replica_id
        self._wall = wall_clock

    async def sync(self, redis: Redis, models: Iterable[str], lanes: Mapping[str, LaneCounts]) -> None:
        """Flush the deltas, publish the waiting lanes, read everything back: one round trip."""
        models = list(models)
        flushing = dict(self._pending)
        self._pending.clear()
        now = self._wall()
        pipe = redis.pipeline(transaction=False)
        try:
            for (model, team), tokens in flushing.items():
                pipe.hincrbyfloat(SVC_KEY.format(model=model), str(team), tokens)
                pipe.expire(SVC_KEY.format(model=model), SVC_TTL_S)
            for model in models:
                mine = lanes.get(model, {})
                key = QUEUE_KEY.format(model=model)
                pipe.hset(key, self.replica_id, json.dumps(_lanes_json(mine, now), separators=(",", ":")))
                pipe.expire(key, QUEUE_TTL_S)
            for model in models:
                pipe.hgetall(SVC_KEY.format(model=model))
                pipe.hgetall(QUEUE_KEY.format(model=model))
            results = await pipe.execute()
        except BaseException:
            for lane, tokens in flushing.items():  # not lost: flushed by the next sync
                self._pending[lane] += tokens
            raise
        reads = results[len(results) - 2 * len(models) :]
        for i, model in enumerate(models):
            self._totals[model] = {int(k): float(v) for k, v in text_map(reads[2 * i]).items()}
            self._interactive_elsewhere[model] = sum(
                lanes_waiting(entry, "interactive")
                for replica, entry in published(text_map(reads[2 * i + 1]), now).items()
                if replica != self.replica_id
            )


def _lanes_json(lanes: LaneCounts, now: float) -> dict[str, Any]:
    return {
        "at": now,
        "lanes": [
            {"class": str(klass), "team_id": team, "waiting": n, "oldest_wait_s": round(oldest, 3)}
            for (klass, team), (n, oldest) in sorted(lanes.items())
        ],
    }
