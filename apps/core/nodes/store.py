"""`NodeStore`: node tokens, the `nodes` table and the fleet listing for the admin API.

Tokens are per node or per node pool (a pool's admits every `<pool>/<instance>`, `apps.core.nodes.ids`),
shown once (a pool's is the operator's, `register_pool`), stored as HMAC-SHA256 hashes. PostgreSQL is
written only at token issue/revoke, registration, drain and disconnect; heartbeats are read from Redis
(`apps.core.nodes.keys`). A revocation is written to both: `revoked_at` is the truth, the Redis set
`nodes:revoked` is checked by the owning orchestrator on every heartbeat write (the node, or for a pool
member its pool, is cut off within one beat) and a message on the node's channel cuts it at once.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from apps.core.errors import InvalidRequest
from apps.core.nodes import keys
from apps.core.nodes.ids import (
    MIN_POOL_TOKEN_CHARS,
    POOL_SEPARATOR,
    TokenKind,
    parse_node_id,
    pool_of,
    validate_token_id,
)
from apps.core.nodes.state import NodeState, derive_state
from apps.core.protocol import bus
from apps.core.secrets import hash_secret, new_secret, secret_matches

TOKEN_PREFIX = "nt-lf"
# How long `list_nodes` keeps showing a disconnected pool member (EKS pods churn; their
# names are never reused, so older ones would only grow the listing).
POOL_MEMBER_HISTORY_S = 24 * 3600.0
LOCATIONS = ("cloud", "onprem")


@dataclass(frozen=True)
class NodeIdentity:
    node_id: str
    location: str
    pool: str | None = None  # set for a pool member `<pool>/<instance>`
    models: tuple[str, ...] | None = None  # what it may register; None: a token from before 0004


class PoolStatus(enum.StrEnum):
    """What `register_pool` did."""

    CREATED = "created"
    ROTATED = "rotated"  # another token replaced the stored one (and lifted any revocation)
    UNCHANGED = "unchanged"
    REVOKED = "revoked"  # the same token was revoked earlier and stays revoked


@dataclass(frozen=True)
class PoolRegistration:
    pool: str
    location: str
    status: PoolStatus

    def as_json(self) -> dict[str, str]:
        return {"pool": self.pool, "location": self.location, "status": self.status.value}


def _models(models: Sequence[str] | None) -> list[str] | None:
    if models is None:
        return None
    if isinstance(models, str) or not all(isinstance(m, str) and m for m in models):
        raise InvalidRequest("models must be a list of model names", param="models")
    return list(models)


def _check_location(location: str) -> None:
    if location not in LOCATIONS:
        raise InvalidRequest(f"location must be one of {', '.join(LOCATIONS)}", param="location")


def as_text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def decode_hash(raw: Mapping[Any, Any]) -> dict[str, str]:
    """A Redis HGETALL answer as str -> str, whatever `decode_responses` the client uses."""
    return {as_text(k): as_text(v) for k, v in raw.items()}


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
        channel_namespace: str,
        heartbeat_interval_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        # channel_namespace: the platform's (apps.core.nodes.keys), where drains and revocations go.
        self._pool = pool
        self._redis = redis
        self._key = secret_key
        self._namespace = channel_namespace
        self._interval = heartbeat_interval_s
        self._clock = clock

    # -- tokens (admin API) ------------------------------------------------------

    async def issue_token(
        self, node_id: str, location: str, *, pool: bool = False, models: Sequence[str] | None = None
    ) -> str:
        """Create or replace a node's (or with `pool=True` a pool's) token; returns it once.

        The token admits registrations of `models` only (None: any model; the admin API always
        passes the list) at `location` only. Issuing a new token lifts a quarantine. Only its hash is stored. An id keeps its kind (node or pool) while its token is live:
        turning a live node into a pool (or back) is refused, after a revoke it is allowed.
        """
        validate_token_id(node_id)
        _check_location(location)
        token = new_secret(TOKEN_PREFIX)
        kind = TokenKind.POOL if pool else TokenKind.NODE
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "INSERT INTO node_tokens (node_id, token_hash, location, kind, models) "
                "VALUES (%s, %s, %s, %s, %s) "
                "ON CONFLICT (node_id) DO UPDATE SET token_hash = EXCLUDED.token_hash, "
                "location = EXCLUDED.location, kind = EXCLUDED.kind, models = EXCLUDED.models, "
                "created_at = now(), revoked_at = NULL "
                "WHERE node_tokens.kind = EXCLUDED.kind OR node_tokens.revoked_at IS NOT NULL "
                "RETURNING node_id",
                (node_id, hash_secret(token, self._key), location, kind.value, _models(models)),
            )
            if await cur.fetchone() is None:
                other = TokenKind.NODE if pool else TokenKind.POOL
                raise InvalidRequest(
                    f"{node_id!r} holds a live {other.value} token; revoke it first", param="node_id"
                )
            await conn.execute(
                "INSERT INTO node_events (node_id, event) VALUES (%s, 'token_issued')", (node_id,)
            )
        await self._redis.srem(keys.NODES_REVOKED, node_id)
        await self._redis.srem(keys.NODES_QUARANTINED, node_id)
        return token

    async def register_pool(
        self, pool_id: str, location: str, token: str, *, models: Sequence[str] | None = None
    ) -> PoolRegistration:
        """Store the hash of an operator-provided pool token (EKS: the Kubernetes Secret's).

        Idempotent: the same token again changes nothing; another token rotates it (and lifts
        a revocation). The same token after a revoke stays revoked: a revoked token is dead,
        re-enabling the pool takes a new one (so a re-run of the deploy Job cannot undo a revoke).
        """
        validate_token_id(pool_id, param="pool")
        _check_location(location)
        if len(token) < MIN_POOL_TOKEN_CHARS:
            raise InvalidRequest(f"a pool token must be at least {MIN_POOL_TOKEN_CHARS} characters")
        token_hash = hash_secret(token, self._key)
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "SELECT token_hash, location::text, kind, revoked_at IS NOT NULL FROM node_tokens "
                "WHERE node_id = %s FOR UPDATE",
                (pool_id,),
            )
            row = await cur.fetchone()
            if row is not None and row[2] != TokenKind.POOL and not row[3]:
                raise InvalidRequest(f"{pool_id!r} holds a live node token; revoke it first", param="pool")
            if row is not None and row[2] == TokenKind.POOL and secret_matches(token, row[0], self._key):
                status = PoolStatus.REVOKED if row[3] else PoolStatus.UNCHANGED
                if not row[3]:
                    await conn.execute(
                        "UPDATE node_tokens SET location = %s, models = %s WHERE node_id = %s",
                        (location, _models(models), pool_id),
                    )
                return PoolRegistration(pool_id, location, status)
            await conn.execute(
                "INSERT INTO node_tokens (node_id, token_hash, location, kind, models) "
                "VALUES (%s, %s, %s, 'pool', %s) "
                "ON CONFLICT (node_id) DO UPDATE SET token_hash = EXCLUDED.token_hash, "
                "location = EXCLUDED.location, kind = 'pool', models = EXCLUDED.models, created_at = now(), "
                "revoked_at = NULL",
                (pool_id, token_hash, location, _models(models)),
            )
            await conn.execute(
                "INSERT INTO node_events (node_id, event) VALUES (%s, 'token_issued')", (pool_id,)
            )
        await self._redis.srem(keys.NODES_REVOKED, pool_id)
        return PoolRegistration(pool_id, location, PoolStatus.CREATED if row is None else PoolStatus.ROTATED)

    async def revoke(self, node_id: str) -> bool:
        """Revoke a node's or a pool's token; the node (every member of the pool) is cut off
        within one heartbeat interval. Pool members have no token of their own: False."""
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "UPDATE node_tokens SET revoked_at = now() WHERE node_id = %s AND revoked_at IS NULL "
                "RETURNING kind",
                (node_id,),
            )
            row = await cur.fetchone()
            members: list[str] = []
            if row is not None:
                await conn.execute(
                    "INSERT INTO node_events (node_id, event) VALUES (%s, 'token_revoked')", (node_id,)
                )
                if row[0] == TokenKind.POOL:
                    prefix = node_id + POOL_SEPARATOR
                    cur = await conn.execute(
                        "SELECT id FROM nodes WHERE left(id, %s) = %s", (len(prefix), prefix)
                    )
                    members = [r[0] for r in await cur.fetchall()]
        if row is None:
            return False
        # The set is what the owners' heartbeat script checks (for a member: its pool id), so a
        # member that registers or heartbeats after this line is refused; the messages below
        # only make the cut immediate for the sockets open now.
        await self._redis.sadd(keys.NODES_REVOKED, node_id)
        message = bus.encode(bus.RevokeMsg())
        pipe = self._redis.pipeline(transaction=False)
        for target in [node_id, *members]:
            pipe.publish(keys.node_channel(target, namespace=self._namespace), message)
        await pipe.execute()
        return True

    async def verify(self, node_id: str, token: str) -> bool:
        return await self.identify(node_id, token) is not None

    async def identify(self, node_id: str, token: str) -> NodeIdentity | None:
        """The node's identity if the token is its current, unrevoked token (for a member
        `<pool>/<instance>`: its pool's; a pool token never admits the bare pool id)."""
        ref = parse_node_id(node_id)
        if ref is None:
            return None
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT token_hash, location::text, revoked_at, kind, models FROM node_tokens WHERE node_id = %s",
                (ref.token_id,),
            )
            row = await cur.fetchone()
        if row is None or row[2] is not None or row[3] != ref.kind:
            return None
        if not secret_matches(token, row[0], self._key):
            return None
        return NodeIdentity(node_id, row[1], ref.pool, tuple(row[4]) if row[4] is not None else None)

    async def ping(self) -> None:
        async with self._pool.connection() as conn:
            await conn.execute("SELECT 1")

    async def request_drain(self, node_id: str) -> bool:
        """Ask the replica owning the node's socket to drain it; False if no replica owns it."""
        channel = keys.node_channel(node_id, namespace=self._namespace)
        receivers = await self._redis.publish(channel, bus.encode(bus.DrainMsg()))
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
        async with self._pool.connection() as conn, conn.transaction():
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
        async with self._pool.connection() as conn, conn.transaction():
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
        rows = await self._listed_rows()
        now = self._clock()
        pipe = self._redis.pipeline(transaction=False)
        for row in rows:
            pipe.hgetall(keys.node_hash(row[0]))
            pipe.zcount(keys.node_inflight(row[0]), now, "+inf")
        answers = await pipe.execute() if rows else []
        return [
            self._listed(row, decode_hash(answers[2 * i]), int(answers[2 * i + 1]), now)
            for i, row in enumerate(rows)
        ]

    async def _listed_rows(self) -> list[Any]:
        async with self._pool.connection() as conn:
            # Registered nodes with the token that admits them (their own or, for `<pool>/<x>`,
            # the pool's), then the tokens nobody registered under (pools always land here).
            cur = await conn.execute(
                "SELECT n.id, COALESCE(n.location, t.location)::text, n.gpus, n.models, n.last_seen, "
                "n.orchestrator_id, t.revoked_at IS NOT NULL, n.state::text, 'node' "
                "FROM nodes n LEFT JOIN node_tokens t ON t.node_id = split_part(n.id, '/', 1) "
                # A pod name never comes back: a member gone for a day is history (node_events).
                "WHERE strpos(n.id, '/') = 0 OR n.state NOT IN ('disconnected', 'drained') "
                "OR n.last_seen IS NULL OR n.last_seen > now() - make_interval(secs => %s) "
                "UNION ALL "
                "SELECT t.node_id, t.location::text, 0, '[]'::jsonb, NULL, NULL, t.revoked_at IS NOT NULL, "
                "NULL, t.kind FROM node_tokens t WHERE NOT EXISTS (SELECT 1 FROM nodes n WHERE n.id = t.node_id) "
                "ORDER BY 1",
                (POOL_MEMBER_HISTORY_S,),
            )
            rows: list[Any] = await cur.fetchall()
        return rows

    def _listed(self, row: Any, hb: dict[str, str], in_flight: int, now: float) -> dict[str, object]:
        """One node's admin listing: its registration or token row, heartbeat and in-flight count."""
        node_id, location, gpus, models, last_seen, owner, revoked, reg_state, token_kind = row
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
        return {
            "node_id": node_id,
            # "pool": a pool's token row (members are listed as nodes with `pool` set).
            "kind": token_kind,
            "pool": pool_of(node_id),
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
            "last_seen": _iso(ts) if ts is not None else (last_seen.isoformat() if last_seen else None),
        }


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat()


__all__ = [
    "LOCATIONS",
    "TOKEN_PREFIX",
    "NodeIdentity",
    "NodeState",
    "NodeStore",
    "PoolRegistration",
    "PoolStatus",
    "as_text",
    "decode_hash",
]
