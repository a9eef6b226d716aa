"""Canary by model revision end to end (issue 30 item 3): the real gateway, orchestrator, two node
agents and two enginesim engines, one per revision, called with the official OpenAI SDK under load.
A canary at 10 % takes exactly its conversations' buckets, each revision is billed exactly what it
served, and a TTFT regression injected on the canary's engine rolls it back by itself with zero
broken streams; afterwards every conversation goes to the stable revision."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import openai
import pytest

from apps.core.rollouts import RolloutStore
from apps.core.scheduling.canary import Rollout, conversation_key, preferred
from apps.enginesim.faults import Faults
from tests.e2e.test_gateway_sdk import poll, sdk
from tests.fleet import MODEL, FleetSetup
from tests.gateway_env import GatewayEnv, gateway_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
STABLE, CANARY = "r-stable", "r-canary"
AT_ONCE = 8  # streams in flight


@dataclass(frozen=True)
class Answer:
    revision: str
    completion_tokens: int
    finish_reason: str | None


def _messages(i: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"conversation {i}"}]


async def _converse(client: openai.AsyncOpenAI, i: int, gate: asyncio.Semaphore) -> Answer:
    async with gate:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=_messages(i),  # type: ignore[arg-type]
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        chunks = [c async for c in raw.parse()]
    usage = chunks[-1].usage
    assert usage is not None
    finish = next(
        (c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason), None
    )
    return Answer(raw.headers["x-llmfleet-model-revision"], usage.completion_tokens, finish)


async def _load(env: GatewayEnv, key: str, ids: range) -> list[Answer]:
    gate = asyncio.Semaphore(AT_ONCE)
    async with sdk(env, key) as client:
        return list(await asyncio.gather(*(_converse(client, i, gate) for i in ids)))


async def _billed(env: GatewayEnv, team_id: int) -> dict[str, tuple[int, int]]:
    """revision -> (settled rows, completion tokens) of the team's ledger."""
    async with env.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT model_revision, count(*), sum(completion_tokens) FROM usage_ledger"
            " WHERE team_id = %s AND status = 'settled' GROUP BY model_revision",
            (team_id,),
        )
        return {r: (int(n), int(t)) for r, n, t in await cur.fetchall()}


async def _settled(env: GatewayEnv, team_id: int, answers: list[Answer]) -> None:
    """Every answer's row settled (the settle runs after the stream: polled), billed to its revision."""
    served = _served(answers)

    async def all_rows() -> bool:
        billed = await _billed(env, team_id)
        return sum(n for n, _ in billed.values()) >= len(answers)

    await poll(all_rows, "every row settled", 60)
    assert await _billed(env, team_id) == served


def _served(answers: list[Answer]) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for a in answers:
        n, t = out.get(a.revision, (0, 0))
        out[a.revision] = (n + 1, t + a.completion_tokens)
    return out


async def test_a_canary_under_load_is_billed_exactly_and_rolled_back_on_a_ttft_regression(
    migrated_db_url: str, redis_url: str
) -> None:
    # A TTFT bound no noise of a loaded machine reaches (two canary first tokens of 20 at 4x the stable's
    # p95), a regression well past it (2 s before the first token, as a slow new revision), and no
    # tokens/s bound (20 streams sharing a loaded machine's event loop: their pace is noise; its rule has
    # its unit tests).
    judge = {
        "canary_min_requests": 10,
        "canary_hold_s": 0,
        "canary_refresh_s": 0.1,
        "canary_window_s": 600,
        "canary_ttft_ratio": 4.0,
        "canary_tokens_per_s_ratio": 0.01,
        # Two nodes' agents, engines, the replica and the gateway share one event loop here: on a loaded
        # machine a beat came late and a node was declared dead (4008), which moved its conversations to
        # the other revision. Liveness is not this test's subject.
        "missed_heartbeats": 10,
    }
    setup = FleetSetup(revisions=(STABLE, CANARY), orchestrator=judge)
    async with gateway_env(migrated_db_url, redis_url, serve=True, fleet=setup) as env:
        team_id, key = await env.team_with_key("canary-team")
        store = RolloutStore(env.pool)
        rollout = await store.start(MODEL, CANARY, 10, STABLE, "test")
        canaries = env.fleet.orchestrator.plane.canaries

        async def live() -> bool:
            return MODEL in canaries.judges

        await poll(live, "the replica reads the rollout")

        # 1. 200 conversations, 20 at a time: each on its bucket's revision, each revision billed exactly.
        first = await _load(env, key, range(200))
        expected = [
            preferred(rollout, conversation_key({"messages": _messages(i)}, team_id, "")) for i in range(200)
        ]
        assert [a.revision for a in first] == expected
        assert 0 < expected.count(CANARY) < 60  # about 10 % of 200
        assert all((a.completion_tokens, a.finish_reason) == (4, "length") for a in first)
        await _settled(env, team_id, first)

        # 2. The canary's engine answers its first token 2 s late: rolled back, no stream broken.
        env.fleet.engines[CANARY].set_faults(Faults(stall_s=2.0))
        second = await _load(env, key, range(200, 400))
        assert all((a.completion_tokens, a.finish_reason) == (4, "length") for a in second)

        async def rolled_back() -> bool:
            return await store.get(MODEL) == Rollout(MODEL, STABLE)

        await poll(rolled_back, "the automatic rollback")
        event = (await store.history(MODEL))[0]
        assert (event.action, event.revision) == ("rollback", CANARY)
        assert event.reason is not None
        assert event.reason.startswith("automatic: TTFT p95")
        rollbacks = env.fleet.orchestrator.plane.metrics.canary_rollbacks
        assert rollbacks.labels(MODEL, CANARY)._value.get() == 1

        # 3. Afterwards every conversation, canary bucket or not, goes to the stable revision.
        third = await _load(env, key, range(200))
        assert {a.revision for a in third} == {STABLE}
        await _settled(env, team_id, first + second + third)
