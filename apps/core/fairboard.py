"""The fair queue's shared state in Redis, as every replica and the admin API see it.

`fair:svc:{model}` — a hash team id -> tokens served (prompt + answer) by every orchestrator
replica, written by their `TeamService.sync` (one pipeline per fleet refresh). `fair:q:{model}` — a
hash replica id -> JSON `{"at": epoch s, "lanes": [{"class", "team_id", "waiting",
"oldest_wait_s"}]}`, what each replica had waiting at its last sync. `read_board` is
`GET /admin/queues`: both, summed over the live replicas, per model, team and class.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from redis.asyncio import Redis

from apps.core.clock import SYSTEM

SVC_KEY = "fair:svc:{model}"
QUEUE_KEY = "fair:q:{model}"
SVC_TTL_S = 86400  # an idle model's counters go away
QUEUE_TTL_S = 60
# A replica's published lanes older than this are ignored (it stopped or lost Redis).
STALE_AFTER_S = 5.0


def text_map(raw: Mapping[Any, Any]) -> dict[str, str]:
    return {
        (k.decode() if isinstance(k, bytes) else str(k)): (v.decode() if isinstance(v, bytes) else str(v))
        for k, v in raw.items()
    }


def published(raw: Mapping[str, str], now: float) -> dict[str, dict[str, Any]]:
    """The replicas' published lanes of one model, without stale or unreadable entries."""
    out: dict[str, dict[str, Any]] = {}
    for replica, text in raw.items():
        try:
            entry = json.loads(text)
        except ValueError:
            continue
        if isinstance(entry, dict) and now - float(entry.get("at", 0)) <= STALE_AFTER_S:
            out[replica] = entry
    return out


def lanes_waiting(entry: Mapping[str, Any], klass: str) -> int:
    return sum(int(lane.get("waiting", 0)) for lane in entry.get("lanes", ()) if lane.get("class") == klass)


async def read_board(redis: Redis, models: Iterable[str], now: float) -> list[dict[str, Any]]:
    """Per model: the live replicas, and per (team, class) the requests waiting on all of them,
    the oldest wait and the tokens served (one pipeline)."""
    models = list(models)
    pipe = redis.pipeline(transaction=False)
    for model in models:
        pipe.hgetall(SVC_KEY.format(model=model))
        pipe.hgetall(QUEUE_KEY.format(model=model))
    results = await pipe.execute()
    out: list[dict[str, Any]] = []
    for i, model in enumerate(models):
        served = {int(k): float(v) for k, v in text_map(results[2 * i]).items()}
        replicas = published(text_map(results[2 * i + 1]), now)
        lanes: dict[tuple[int, str], dict[str, Any]] = {}
        for entry in replicas.values():
            for lane in entry.get("lanes", ()):
                key = (int(lane["team_id"]), str(lane["class"]))
                cur = lanes.setdefault(
                    key, {"team_id": key[0], "class": key[1], "waiting": 0, "oldest_wait_s": 0.0}
                )
                cur["waiting"] += int(lane.get("waiting", 0))
                cur["oldest_wait_s"] = max(cur["oldest_wait_s"], float(lane.get("oldest_wait_s", 0.0)))
        teams = sorted(set(served) | {team for team, _ in lanes})
        out.append(
            {
                "model": model,
                "replicas": len(replicas),
                "waiting": sum(lane["waiting"] for lane in lanes.values()),
                "teams": [
                    {
                        "team_id": team,
                        "served_tokens": served.get(team, 0.0),
                        "classes": [lanes[key] for key in sorted(lanes) if key[0] == team],
                    }
                    for team in teams
                ],
            }
        )
    return out


class RedisQueueBoard:
    """`GET /admin/queues` over Redis (the gateway's `QueueBoard`)."""

    def __init__(self, redis: Redis, wall_clock: Callable[[], float] = SYSTEM.wall) -> None:
        self._redis = redis
        self._wall = wall_clock

    async def read(self, models: Iterable[str]) -> list[dict[str, Any]]:
        return await read_board(self._redis, models, self._wall())
