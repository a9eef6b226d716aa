"""Settle one request's usage exactly once and account it against the key's daily token quota.

The orchestrator calls `settle_usage` with the engine's exact usage. Only a *new* settlement
increments `tpd:{subject}:{yyyymmdd}` in Redis (the subject the request was admitted under: the key
id, or `jwt-<sub>` for a JWT caller), so a retried settle never counts tokens twice. The counter expires after two days.
A Redis failure here does not undo the settlement (money is the source of truth); it is
re-raised so the caller can count it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from apps.core.ledger.api import Ledger, SettleOutcome, SettleResult

TPD_TTL_S = 2 * 24 * 3600
# INCRBY and EXPIRE in one command (atomic, one reply to parse): cheaper than a MULTI/EXEC pipeline.
# The request's in-flight worst case (`apps.core.quota.admission`) leaves in the same script.
_COUNT_LUA = """
redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('HDEL', KEYS[2], ARGV[3])
return 1
"""


def tpd_key(key_id: int | str, when: datetime) -> str:
    return f"tpd:{key_id}:{when.astimezone(UTC):%Y%m%d}"


def tpd_inflight_key(key_id: int | str) -> str:
    return f"tpd:{key_id}:inflight"


async def settle_usage(
    ledger: Ledger,
    redis: Any,
    request_id: str,
    prompt_tokens: int,
    completion_tokens: int,
    *,
    resume_prompt_tokens: int = 0,
    cached_prompt_tokens: int = 0,
    node_id: str | None = None,
    model_revision: str | None = None,
    now: datetime | None = None,
) -> SettleResult:
    result = await ledger.settle(
        request_id,
        prompt_tokens,
        completion_tokens,
        resume_prompt_tokens=resume_prompt_tokens,
        cached_prompt_tokens=cached_prompt_tokens,
        node_id=node_id,
        model_revision=model_revision,
    )
    subject = result.tokens_subject
    if result.outcome is SettleOutcome.SETTLED and subject is not None:
        key = tpd_key(subject, now or datetime.now(UTC))
        count = redis.register_script(_COUNT_LUA)  # a local object: EVALSHA, loaded on first use
        await count(
            keys=[key, tpd_inflight_key(subject)],
            args=[result.prompt_tokens + result.completion_tokens, TPD_TTL_S, request_id],
        )
    return result
