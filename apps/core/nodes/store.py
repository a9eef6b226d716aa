"""`NodeStore`: node tokens, the `nodes` table and the fleet listing for the admin API.

Tokens are per node, shown once and stored as HMAC-SHA256 hashes (`apps.core.secrets`).
PostgreSQL is written only at token issue/revoke, registration, drain and disconnect;
heartbeats are read from Redis (`apps.core.nodes.keys`). Revocation is written to both
stores: the `revoked_at` column is the truth, the Redis set `nodes:revoked` is checked
atomically by the owning orchestrator on every heartbeat write (so the node is cut off
within one heartbeat interval) and a message on the node's channel cuts it at once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from apps.core.errors import InvalidRequest
from apps.core.nodes import keys
from apps.core.nodes.state import NodeState, derive_state
from apps.core.secrets import hash_secret, new_secret, secret_matches

TOKEN_PREFIX = "nt-lf"
LOCATIONS = ("cloud", "onprem")


@dataclass(frozen=True)
class NodeIdentity:
    node_id: str
    location: str


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def decode_hash(raw: Mapping[Any, Any]) -> dict[str, str]:
    """A Redis HGETALL answer as str -> str, whatever `decode_responses` the client uses."""
    return {_text(k): _text(v) for k, v in raw.items()}


def _float(value: str | None) -> float | None:
    if value is None or value == "":
        return None
    try:
        return float(value)
    except ValueError:
        return None


class NodeStore:
    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        redis: Redis,
        secret_key: bytes,
        *,
        heartbeat_interval_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._pool = pool
        self._redis = redis
        self._key = secret_key
        self._interval = heartbeat_interval_s
        self._clock = clock

    # -- tokens (admin API) ------------------------------------------------------

    async def issue_token(self, node_id: str, location: str) -> str:
        """Create or replace the node's token; returns it once (only its hash is stored)."""
        if location not in LOCATIONS:
            raise InvalidRequest(f"location must be one of {', '.join(LOCATIONS)}", param="location")
        if not node_id or len(node_id) > 128:
            raise InvalidRequest("node_id must be 1 to 128 characters", param="node_id")
        token = new_secret(TOKEN_PREFIX)
        async with self._pool.connection() as conn:
            await conn.execute(
                "INSERT INTO node_tokens (node_id, token_hash, location) VALUES (%s, %s, %s) "
                "ON CONFLICT (node_id) DO UPDATE SET token_hash = EXCLUDED.token_hash, "
                "location = EXCLUDED.location, created_at = now(), revoked_at = NULL",
                (node_id, hash_secret(token, self._key), location),
            )
            await conn.execute(
                "INSERT INTO node_events (node_id, event) VALUES (%s, 'token_issued')", (node_id,)
            )
        await self._redis.srem(keys.NODES_REVOKED, node_id)
        return token

    async def revoke(self, node_id: str) -> bool:
        """Revoke the node's token; its socket is closed within one heartbeat interval."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "UPDATE node_tokens SET revoked_at = now() WHERE node_id = %s AND revoked_at IS NULL",
                (node_id,),
            )
            revoked: bool = cur.rowcount > 0
            if revoked:
                await conn.execute(
                    "INSERT INTO node_events (node_id, event) VALUES (%s, 'token_revoked')", (node_id,)
                )
        if revoked:
            await self._redis.sadd(keys.NODES_REVOKED, node_id)
            await self._redis.publish(keys.node_channel(node_id), json.dumps({"op": "revoke"}))
        return revoked

    async def verify(self, node_id: str, token: str) -> bool:
        return await self.identify(node_id, token) is not None

    async def identify(self, node_id: str, token: str) -> NodeIdentity | None:
        """The node's identity if the token is its current, unrevoked token."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT token_hash, location::text, revoked_at FROM node_tokens WHERE node_id = %s",
                (node_id,),
            )
            row = await cur.fetchone()
        if row is None or row[2] is not None:
            return None
        if not secret_matches(token, row[0], self._key):
            return None
        return NodeIdentity(node_id, row[1])

    async def ping(self) -> None:
        async with self._pool.connection() as conn:
            await conn.execute("SELECT 1")

    async def request_drain(self, node_id: str) -> bool:
        """Ask the replica owning the node's socket to drain it; False if no replica owns it."""
        receivers = await self._redis.publish(keys.node_channel(node_id), json.dumps({"op": "drain"}))
        return int(receivers) > 0

    # -- registry events (orchestrator) -------------------------------------------

    async def record_registration(
        self,
        *,
        node_id: str,
        location: str,
        gpus: int,
        models: list[dict[str, Any]],
        orchestrator_id: str,
        agent_version: str = "",
    ) -> None:
        async with self._pool.connection() as conn:
            await conn.execute(
                "INSERT INTO nodes (id, location, gpus, models, last_seen, orchestrator_id, state, "
                "agent_version, registered_at, drained_at) "
                "VALUES (%s, %s, %s, %s, now(), %s, 'registered', %s, now(), NULL) "
                "ON CONFLICT (id) DO UPDATE SET location = EXCLUDED.location, gpus = EXCLUDED.gpus, "
                "models = EXCLUDED.models, last_seen = now(), orchestrator_id = EXCLUDED.orchestrator_id, "
                "state = 'registered', agent_version = EXCLUDED.agent_version, registered_at = now(), "
                "drained_at = NULL",
                (node_id, location, gpus, Jsonb(models), orchestrator_id, agent_version),
            )
            await conn.execute(
                "INSERT INTO node_events (node_id, event, orchestrator_id) VALUES (%s, 'registered', %s)",
                (node_id, orchestrator_id),
            )

    async def record_event(self, node_id: str, event: str, orchestrator_id: str, detail: str = "") -> None:
        """`draining`, `drained` or `disconnected`: updates the row and appends an event."""
        state = {"draining": "draining", "drained": "drained", "disconnected": "disconnected"}.get(event)
        if state is None:
            raise ValueError(f"unknown node event {event!r}")
        async with self._pool.connection() as conn:
            # A disconnect must not overwrite `drained`, and only the owning replica's
            # events touch the row (a superseded socket closing late changes nothing).
            await conn.execute(
                "UPDATE nodes SET state = CASE WHEN %s = 'disconnected' AND state = 'drained' "
                "THEN state ELSE %s::node_reg_state END, last_seen = now(), "
                "drained_at = CASE WHEN %s = 'drained' THEN now() ELSE drained_at END "
                "WHERE id = %s AND orchestrator_id = %s",
                (state, state, state, node_id, orchestrator_id),
            )
            await conn.execute(
                "INSERT INTO node_events (node_id, event, orchestrator_id, detail) VALUES (%s, %s, %s, %s)",
                (node_id, event, orchestrator_id, detail[:500]),
            )

    # -- listing (admin API) ------------------------------------------------------

    async def list_nodes(self) -> list[dict[str, object]]:
        """Every node with a token or a registration, merged with its live heartbeat."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT COALESCE(n.id, t.node_id), COALESCE(n.location, t.location)::text, "
                "COALESCE(n.gpus, 0), COALESCE(n.models, '[]'::jsonb), n.last_seen, n.orchestrator_id, "
                "t.revoked_at IS NOT NULL, n.state::text "
                "FROM node_tokens t FULL OUTER JOIN nodes n ON n.id = t.node_id ORDER BY 1"
            )
            rows = await cur.fetchall()
        now = self._clock()
        pipe = self._redis.pipeline(transaction=False)
        for row in rows:
            pipe.hgetall(keys.node_hash(row[0]))
            pipe.zcount(keys.node_inflight(row[0]), now, "+inf")
        answers = await pipe.execute() if rows else []
        out: list[dict[str, object]] = []
        for i, row in enumerate(rows):
            node_id, location, gpus, models, last_seen, owner, revoked, reg_state = row
            hb = decode_hash(answers[2 * i])
            in_flight = int(answers[2 * i + 1])
            ts = _float(hb.get("ts"))
            age = round(max(0.0, now - ts), 3) if ts is not None else None
            state = derive_state(
                revoked=bool(revoked),
                heartbeat_present=bool(hb),
                heartbeat_age_s=age,
                draining=hb.get("draining") == "1" or reg_state == "draining",
                heartbeat_interval_s=self._interval,
            )
            names = [m.get("name") for m in models if isinstance(m, dict)] if isinstance(models, list) else []
            out.append(
                {
                    "node_id": node_id,
                    "location": location,
                    "gpus": gpus,
                    "models": names,
                    "state": state.value,
                    "queue_depth": int(_float(hb.get("queue_depth")) or 0) if hb else None,
                    "kv_cache_usage": _float(hb.get("kv_cache_usage")) if hb else None,
                    "gpu_util": _float(hb.get("gpu_util")) if hb else None,
                    "in_flight": in_flight,
                    "orchestrator_id": hb.get("orchestrator_id") or owner,
                    "last_heartbeat_age_s": age,
                    "last_seen": _iso(ts)
                    if ts is not None
                    else (last_seen.isoformat() if last_seen else None),
                }
            )
        return out


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat()


__all__ = ["LOCATIONS", "TOKEN_PREFIX", "NodeIdentity", "NodeState", "NodeStore", "decode_hash"]
