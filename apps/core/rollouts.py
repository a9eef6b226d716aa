"""`RolloutStore`: each model's live revisions in PostgreSQL (`model_rollouts`, migration 0015) and
their history (`model_rollout_events`). Written by `llmfleet model canary|promote|rollback` and by an
orchestrator replica that rolls a canary back; read by every replica (`apps/orchestrator/canary.py`).

A rollback names the revision it rolls back, so two replicas that judge the same canary at once roll
it back once (the second finds another state and does nothing), and a rollback never hits a newer
canary started meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from apps.core.errors import InvalidRequest, NotFound
from apps.core.scheduling.canary import Rollout

MAX_REVISION = 128  # as the node protocol's `ModelInfo.revision`


@dataclass(frozen=True)
class RolloutEvent:
    at: datetime
    action: str
    revision: str
    weight: float | None
    actor: str
    reason: str | None


def _revision(value: str, param: str) -> str:
    if not value or len(value) > MAX_REVISION or any(c.isspace() for c in value):
        raise InvalidRequest(
            f"{param}: a revision is 1-{MAX_REVISION} characters without spaces", param=param
        )
    return value


class RolloutStore:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool

    async def live(self) -> dict[str, Rollout]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT model, stable_revision, canary_revision, weight_percent FROM model_rollouts"
            )
            rows = await cur.fetchall()
        return {m: Rollout(m, s, c, float(w)) for m, s, c, w in rows}

    async def get(self, model: str) -> Rollout | None:
        return (await self.live()).get(model)

    async def start(
        self, model: str, revision: str, weight: float, stable: str | None, actor: str
    ) -> Rollout:
        """Send `weight` percent of the model's conversations to `revision` (a new canary, or the live
        canary's new weight). `stable`: the revision the rest goes to, needed when the model has no
        rollout yet (later: the row's)."""
        _revision(revision, "revision")
        if not 0 <= weight <= 100:
            raise InvalidRequest("weight: a percentage from 0 to 100", param="weight")
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "SELECT stable_revision, canary_revision FROM model_rollouts WHERE model = %s FOR UPDATE",
                (model,),
            )
            row = await cur.fetchone()
            base = row[0] if row else (_revision(stable, "stable") if stable else None)
            if base is None:
                raise InvalidRequest(
                    f"model {model!r} has no rollout yet: say which revision is stable (--stable or --stack)",
                    param="stable",
                )
            if revision == base:
                raise InvalidRequest(f"{revision!r} is the stable revision of {model!r}", param="revision")
            if row and row[1] is not None and row[1] != revision:
                raise InvalidRequest(
                    f"canary {row[1]!r} of {model!r} is live: promote or roll it back first", param="revision"
                )
            await conn.execute(
                "INSERT INTO model_rollouts (model, stable_revision, canary_revision, weight_percent)"
                " VALUES (%s, %s, %s, %s) ON CONFLICT (model) DO UPDATE SET canary_revision = EXCLUDED."
                "canary_revision, weight_percent = EXCLUDED.weight_percent, updated_at = now()",
                (model, base, revision, weight),
            )
            await self._event(conn, model, "canary", revision, weight, actor, None)
        return Rollout(model, base, revision, weight)

    async def promote(self, model: str, actor: str) -> Rollout:
        """The canary becomes the stable revision and takes every request."""
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "UPDATE model_rollouts SET stable_revision = canary_revision, canary_revision = NULL,"
                " weight_percent = 0, updated_at = now() WHERE model = %s AND canary_revision IS NOT NULL"
                " RETURNING stable_revision",
                (model,),
            )
            row = await cur.fetchone()
            if row is None:
                raise NotFound(f"model {model!r} has no canary to promote", param="model")
            await self._event(conn, model, "promote", row[0], 100.0, actor, None)
        return Rollout(model, row[0])

    async def rollback(self, model: str, revision: str | None, actor: str, reason: str | None) -> bool:
        """Take the canary out of traffic (only if it is still `revision`; None: whatever canary is
        live). False when there was nothing to roll back (already done, e.g. by another replica)."""
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "UPDATE model_rollouts SET retired_revision = canary_revision, canary_revision = NULL,"
                " weight_percent = 0, updated_at = now() WHERE model = %s AND canary_revision IS NOT NULL"
                " AND (%s::text IS NULL OR canary_revision = %s) RETURNING retired_revision",
                (model, revision, revision),
            )
            row = await cur.fetchone()
            if row is None:
                return False
            await self._event(conn, model, "rollback", row[0], 0.0, actor, reason)
        return True

    async def history(self, model: str, limit: int = 20) -> list[RolloutEvent]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT at, action, revision, weight_percent, actor, reason FROM model_rollout_events"
                " WHERE model = %s ORDER BY at DESC, id DESC LIMIT %s",
                (model, limit),
            )
            rows = await cur.fetchall()
        return [RolloutEvent(a, b, c, None if d is None else float(d), e, f) for a, b, c, d, e, f in rows]

    @staticmethod
    async def _event(
        conn: AsyncConnection[Any],
        model: str,
        action: str,
        revision: str,
        weight: float | None,
        actor: str,
        reason: str | None,
    ) -> None:
        await conn.execute(
            "INSERT INTO model_rollout_events (model, action, revision, weight_percent, actor, reason)"
            " VALUES (%s, %s, %s, %s, %s, %s)",
            (model, action, revision, weight, actor, reason),
        )
