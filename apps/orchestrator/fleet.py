"""The fleet as every replica sees it, kept in Redis (heartbeats, ownership, slot counters).

Writes (owner replica): `write_heartbeat` is one Lua script that refuses to write when the
node was revoked or when another socket (`conn`) took the node over, so a revoked or
superseded socket learns it on its next heartbeat. Reads (every replica): `refresh` loads
all live nodes in one pipeline every `fleet_refresh_s`. Capacity across replicas:
`acquire_slot` atomically checks the node is alive and not draining, that its in-flight
ZSET is below `max_num_seqs`, adds the request and records the assignment `req:{id}`;
entries carry an expiry so a crashed replica's slots free themselves.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from redis.asyncio import Redis

from apps.core.budget import UNBOUNDED, Budget
from apps.core.nodes import keys
from apps.core.nodes.state import derive_state
from apps.core.nodes.store import as_text, decode_hash
from apps.orchestrator.scheduling.view import NodeView

HEARTBEAT_OK = 1
HEARTBEAT_SUPERSEDED = 0
HEARTBEAT_REVOKED = -1

_HEARTBEAT_LUA = """
-- KEYS: node hash, revoked set, index. ARGV: node_id, conn, ttl_ms, now, force, field, value, ...
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then return -1 end
-- A pool member `<pool>/<instance>` is revoked with its pool (apps.core.nodes.ids).
local pool = string.match(ARGV[1], '^([^/]+)/')
if pool and redis.call('SISMEMBER', KEYS[2], pool) == 1 then return -1 end
if ARGV[5] ~= '1' then
  local cur = redis.call('HGET', KEYS[1], 'conn')
  if cur and cur ~= ARGV[2] then return 0 end
else
  redis.call('DEL', KEYS[1])
end
local fields = {}
for i = 6, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], 'conn', ARGV[2], unpack(fields))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
return 1
"""

_REMOVE_LUA = """
-- KEYS: node hash. ARGV: conn. Delete only our own registration.
if redis.call('HGET', KEYS[1], 'conn') == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

_DRAIN_LUA = """
if redis.call('HGET', KEYS[1], 'conn') == ARGV[1] then return redis.call('HSET', KEYS[1], 'draining', '1') end
return -1
"""

_ACQUIRE_LUA = """
-- KEYS: node hash, inflight zset, req hash, quarantined set.
-- ARGV: request_id, max, now, expiry, node_id, origin, req_ttl_s, resumable, revision ('' not
-- known), then the budget's field/value pairs (`Budget.to_fields`, none when unbounded)
if redis.call('SISMEMBER', KEYS[4], ARGV[5]) == 1 then return -1 end
local h = redis.call('HMGET', KEYS[1], 'conn', 'draining', 'orchestrator_id')
if not h[1] then return -1 end
if h[2] == '1' then return -2 end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[3])
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[7])
-- `conn`: the node's socket this assignment goes to (the settle refuses a report that socket sent
-- before the assignment reached it: `settle_lua.RECORD_DONE_LUA`).
redis.call('HSET', KEYS[3], 'node', ARGV[5], 'origin', ARGV[6], 'conn', h[1])
redis.call('HDEL', KEYS[3], 'relayed')  -- a new node's report is held against its own events
if ARGV[8] == '1' then redis.call('HSET', KEYS[3], 'resumable', '1') end
-- The revision the node serves: what the settle records on the ledger row (a retry on another
-- node forgets the first node's).
if ARGV[9] ~= '' then redis.call('HSET', KEYS[3], 'revision', ARGV[9]) else redis.call('HDEL', KEYS[3], 'revision') end
if #ARGV > 9 then redis.call('HSET', KEYS[3], unpack(ARGV, 10)) end
redis.call('HINCRBY', KEYS[3], 'attempt', 1)
redis.call('EXPIRE', KEYS[3], ARGV[7])
return {1, h[3] or ''}
"""


def _f(value: str | None, default: float = 0.0) -> float:
    try:
        return float(value) if value not in (None, "") else default
    except ValueError:
        return default


class Fleet:
    def __init__(
        self,
        redis: Redis,
        *,
        heartbeat_interval_s: float,
        heartbeat_ttl_s: float,
        missed_heartbeats: int,
        max_request_s: float,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._redis = redis
        self._interval = heartbeat_interval_s
        self._ttl_ms = int(heartbeat_ttl_s * 1000)
        self._missed = missed_heartbeats
        self._max_request_s = max_request_s
        self._clock = wall_clock
        self._heartbeat = redis.register_script(_HEARTBEAT_LUA)
        self._remove = redis.register_script(_REMOVE_LUA)
        self._drain = redis.register_script(_DRAIN_LUA)
        self._acquire = redis.register_script(_ACQUIRE_LUA)
        self._nodes: dict[str, NodeView] = {}
        self._quarantined: set[str] = set()  # never routed to (`quarantine`), as of the last refresh
        # `forget` during a refresh: that refresh's reads may predate the node's removal, so it
        # must not put the node back (node id -> the `_epoch` it was forgotten at).
        self._epoch = 0
        self._forgotten: dict[str, int] = {}
        self._refreshing: list[int] = []  # the epochs the refreshes in progress started at

    # -- owner side ---------------------------------------------------------------

    async def write_heartbeat(
        self, node_id: str, conn_id: str, fields: Mapping[str, str | int | float], *, register: bool = False
    ) -> int:
        now = self._clock()
        flat: list[str | int | float] = []
        for k, v in {**fields, "ts": now}.items():
            flat += [k, v]
        result = await self._heartbeat(
            keys=[keys.node_hash(node_id), keys.NODES_REVOKED, keys.NODES_INDEX],
            args=[node_id, conn_id, self._ttl_ms, now, "1" if register else "0", *flat],
        )
        return int(result)

    async def remove(self, node_id: str, conn_id: str) -> bool:
        return int(await self._remove(keys=[keys.node_hash(node_id)], args=[conn_id])) > 0

    async def mark_draining(self, node_id: str, conn_id: str) -> None:
        await self._drain(keys=[keys.node_hash(node_id)], args=[conn_id])
        if node_id in self._nodes:
            self._nodes.pop(node_id)

    # -- every replica --------------------------------------------------------------

    async def refresh(self) -> dict[str, NodeView]:
        started = self._epoch
        self._refreshing.append(started)
        try:
            ids, answers, now = await self._read()
        finally:
            self._refreshing.remove(started)
        self._quarantined = {as_text(m) for m in answers[-1]} if ids else set()
        nodes: dict[str, NodeView] = {}
        for i, node_id in enumerate(ids):
            if node_id in self._quarantined or self._forgotten.get(node_id, -1) > started:
                continue  # quarantined, or its socket was torn down while this refresh read
            view = self._view(node_id, decode_hash(answers[2 * i]), int(answers[2 * i + 1]), now)
            if view is not None:
                nodes[node_id] = view
        self._nodes = nodes
        oldest = min(self._refreshing, default=self._epoch)
        self._forgotten = {n: e for n, e in self._forgotten.items() if e > oldest}
        return nodes

    async def _read(self) -> tuple[list[str], list[Any], float]:
        """The index's node ids, then in one round trip each one's hash and in-flight count, the
        index's pruning and the quarantined set."""
        now = self._clock()
        ids = [
            k.decode() if isinstance(k, bytes) else str(k)
            for k in await self._redis.zrange(keys.NODES_INDEX, 0, -1)
        ]
        pipe = self._redis.pipeline(transaction=False)
        for node_id in ids:
            pipe.hgetall(keys.node_hash(node_id))
            pipe.zcount(keys.node_inflight(node_id), now, "+inf")
        # Forget index entries whose node has been silent for a long time (the hash is gone).
        pipe.zremrangebyscore(keys.NODES_INDEX, "-inf", now - 3600)
        pipe.smembers(keys.NODES_QUARANTINED)
        answers = await pipe.execute() if ids else []
        return ids, answers, now

    def _view(self, node_id: str, hb: dict[str, str], in_flight: int, now: float) -> NodeView | None:
        if not hb.get("conn"):
            return None
        try:
            models = {str(k): int(v) for k, v in json.loads(hb.get("models", "{}")).items()}
        except (ValueError, AttributeError):
            models = {}
        try:
            revisions = {str(k): str(v) for k, v in json.loads(hb.get("revisions", "{}")).items()}
        except (ValueError, AttributeError):
            revisions = {}
        state = derive_state(
            revoked=False,
            heartbeat_present=True,
            heartbeat_age_s=max(0.0, now - _f(hb.get("ts"), now)),
            draining=hb.get("draining") == "1",
            heartbeat_interval_s=self._interval,
            missed_heartbeats=self._missed,
        )
        return NodeView(
            node_id=node_id,
            location=hb.get("location", "cloud"),
            models=models,
            state=state,
            in_flight=in_flight,
            kv_cache_usage=_f(hb.get("kv_cache_usage")),
            queue_depth=int(_f(hb.get("queue_depth"))),
            owner=hb.get("orchestrator_id", ""),
            conn=hb.get("conn", ""),
            revisions=revisions,
        )

    def snapshot(self) -> list[NodeView]:
        return list(self._nodes.values())

    def get(self, node_id: str) -> NodeView | None:
        return self._nodes.get(node_id)

    def put(self, view: NodeView) -> None:
        """A local change known before the next refresh (registration, heartbeat)."""
        if view.node_id not in self._quarantined:
            self._nodes[view.node_id] = view

    async def quarantine(self, node_id: str) -> None:
        """Take a node out of routing on every replica (it stays connected, so its in-flight
        requests finish and settle, capped). Lifted when an admin issues the node a new token."""
        self._quarantined.add(node_id)
        self._nodes.pop(node_id, None)
        await self._redis.sadd(keys.NODES_QUARANTINED, node_id)

    def forget(self, node_id: str) -> None:
        """The node's socket here was torn down (its hash removed): out of the view now, and not put
        back by a refresh that read the hash before the removal."""
        self._nodes.pop(node_id, None)
        if self._refreshing:
            self._epoch += 1
            self._forgotten[node_id] = self._epoch

    async def acquire_slot(
        self,
        node: NodeView,
        model: str,
        request_id: str,
        origin: str,
        *,
        budget: Budget = UNBOUNDED,
        resumable: bool = False,
        capacity: int | None = None,
    ) -> int:
        """1 taken; 0 full (`capacity` slots in use; default the node's `max_num_seqs`); -1 node
        gone (or quarantined); -2 draining. Records `req:{id}` = {node, origin, conn (the node's
        registered socket), revision (the model revision it serves), attempt} and,
        the request's budget (`Budget.to_fields`: the bounds the settle caps the node's report at) and whether the stream may
        resume elsewhere (`resumable`: a mid-stream error of this node is not settled from its own
        report, see `settle.py`). When taken, the fleet view's entry carries the node's owner as
        Redis has it now (`get(node_id).owner`)."""
        now = self._clock()
        answer = await self._acquire(
            keys=[
                keys.node_hash(node.node_id),
                keys.node_inflight(node.node_id),
                keys.request_key(request_id),
                keys.NODES_QUARANTINED,
            ],
            args=[
                request_id,
                node.models.get(model, 0) if capacity is None else capacity,
                now,
                now + self._max_request_s,
                node.node_id,
                origin,
                int(self._max_request_s) + 60,
                "1" if resumable else "0",
                node.revisions.get(model, ""),
                *(item for pair in budget.to_fields().items() for item in pair),
            ],
        )
        if isinstance(answer, list):  # taken: {1, the replica owning the node's socket now}
            # The owner as Redis has it at this instant, not as of the last refresh: a node that
            # moved to another replica (a handover) is reached through its new owner.
            owner = as_text(answer[1]) or node.owner
            self._nodes[node.node_id] = replace(node.with_in_flight(+1), owner=owner)
            return 1
        result = int(answer)
        if result in (-1, -2):
            self._nodes.pop(node.node_id, None)
        return result

    async def release_slot(self, node_id: str, request_id: str) -> None:
        if int(await self._redis.zrem(keys.node_inflight(node_id), request_id)):
            self.slot_freed(node_id)

    def slot_freed(self, node_id: str) -> None:
        """A slot of this node was freed in Redis (here or by the settler's script)."""
        current = self._nodes.get(node_id)
        if current is not None:
            self._nodes[node_id] = current.with_in_flight(-1)

    async def assignment_node(self, request_id: str) -> str | None:
        raw: Any = await self._redis.hget(keys.request_key(request_id), "node")
        if raw is None:
            return None
        return raw.decode() if isinstance(raw, bytes) else str(raw)
