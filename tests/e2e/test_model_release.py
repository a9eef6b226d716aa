"""Shipping a model version end to end (issue 30): the real gateway, orchestrator, one node agent and
enginesim engine per revision (the bad candidate's engine seeded otherwise: other "weights"), the
registry on moto's S3 with a local signing key, the official OpenAI SDK under load, and every step
through the commands a platform engineer types (README "Shipping a new model version").

Publish; a tampered revision refused by model-sync; the golden set recorded from the stable revision;
`model eval` passing the candidate and failing the bad one, which the gate then keeps from traffic; a
canary at 10 % under load taking exactly its conversations' buckets, each revision billed exactly what
it served; a TTFT regression injected on the canary's engine rolling it back by itself with zero broken
streams; the canary again and `promote`; afterwards every conversation on the new revision; and
`ops audit` naming the revision and node of every request."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from apps.core.rollouts import RolloutStore
from apps.core.scheduling.canary import Rollout, conversation_key, preferred
from apps.enginesim.faults import Faults
from tests.commands import llmfleet
from tests.e2e.test_gateway_sdk import poll, sdk
from tests.fleet import MODEL, FleetSetup
from tests.gateway_env import GatewayEnv, gateway_env
from tests.integration.test_model_eval import BUCKET, publish, record_golden
from tests.unit.s3_mock import key_pair, mock_bucket

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]
STABLE, CANARY, BAD = "r-stable", "r-canary", "r-bad"
AT_ONCE = 8  # streams in flight


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The registry's bucket on moto's S3 (in-process; the commands' boto3 clients use it)."""
    with mock_bucket(monkeypatch, BUCKET) as client:
        yield client


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


async def test_a_model_version_ships_evaluated_canaried_rolled_back_promoted_and_audited(
    migrated_db_url: str, redis_url: str, s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
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
        # The agents, engines, the replica and the gateway share one event loop here: on a loaded
        # machine a beat came late and a node was declared dead (4008), which moved its conversations to
        # the other revision. Liveness is not this test's subject.
        "missed_heartbeats": 10,
    }
    keys = key_pair(tmp_path)
    registry = ["--bucket", BUCKET, "--signing-key", str(keys.private)]
    gate = ["--database-url", migrated_db_url, "--bucket", BUCKET, "--verify-key", str(keys.public)]
    setup = FleetSetup(revisions=(STABLE, CANARY, BAD), seeds={BAD: 7}, orchestrator=judge)
    async with gateway_env(migrated_db_url, redis_url, serve=True, fleet=setup) as env:
        team_id, key = await env.team_with_key("canary-team")
        await env.deps.teams.add_credits((await env.deps.teams.create_team("release")).id, 10**9)
        admin = env.issuer.mint("release-bot", team="release", admin=True)
        store = RolloutStore(env.pool)

        # 1. Publish the candidates, signed; a tampered revision is refused by model-sync, one line.
        for revision in (CANARY, BAD, "r-tampered"):
            await publish(revision, tmp_path, registry)
        s3.put_object(Bucket=BUCKET, Key=f"{MODEL}/r-tampered/model.safetensors", Body=b"backdoor")
        monkeypatch.setenv(
            "LLMFLEET_MODEL_VERIFY_KEY", str(keys.public)
        )  # as the pod's init container has it
        code, _, err = await llmfleet(
            "model-sync", "--bucket", BUCKET, "--model", MODEL, "--revision", "r-tampered",
            "--dest", str(tmp_path / "cache"),
        )  # fmt: skip
        assert code == 2
        assert len(err.strip().splitlines()) == 1
        assert "r-tampered/model.safetensors" in err
        assert not (tmp_path / "cache" / MODEL / "r-tampered").exists()

        # 2. Stage the candidate without traffic, record the golden set from the stable, evaluate.
        code, _, err = await llmfleet(
            "model",
            "canary",
            "--model",
            MODEL,
            "--revision",
            CANARY,
            "--weight",
            "0",
            "--stable",
            STABLE,
            *gate,
        )
        assert code == 0, err
        suite = tmp_path / "golden.yaml"
        async with sdk(env, admin) as client:
            await record_golden(client, STABLE, suite)
        evaluate = ["model", "eval", "--model", MODEL, "--suite", str(suite), "--stack", "dev", *registry]
        evaluate += ["--base-url", env.base_url + "/v1", "--api-key", admin]
        passed = await llmfleet(*evaluate, "--revision", CANARY)
        assert passed[0] == 0, passed[1:]
        failed = await llmfleet(*evaluate, "--revision", BAD)
        assert failed[0] == 1, failed[1:]
        code, _, err = await llmfleet(
            "model", "canary", "--model", MODEL, "--revision", BAD, "--weight", "10", *gate
        )
        assert (code, f"revision {BAD} failed its evaluation" in err) == (2, True)

        # 3. The canary at 10 %: 200 conversations, 8 at a time, each on its bucket's revision, each
        # revision billed exactly.
        code, _, err = await llmfleet(
            "model", "canary", "--model", MODEL, "--revision", CANARY, "--weight", "10", *gate
        )
        assert code == 0, err
        rollout = Rollout(MODEL, STABLE, CANARY, 10.0)
        canaries = env.fleet.orchestrator.plane.canaries

        async def live() -> bool:
            return canaries.rollouts.get(MODEL) == rollout

        await poll(live, "the replica reads the rollout")
        first = await _load(env, key, range(200))
        expected = [
            preferred(rollout, conversation_key({"messages": _messages(i)}, team_id, "")) for i in range(200)
        ]
        assert [a.revision for a in first] == expected
        assert 0 < expected.count(CANARY) < 60  # about 10 % of 200
        assert all((a.completion_tokens, a.finish_reason) == (4, "length") for a in first)
        await _settled(env, team_id, first)

        # 4. The canary's engine answers its first token 2 s late: rolled back, no stream broken.
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
        third = await _load(env, key, range(200))  # every conversation on the stable revision now
        assert {a.revision for a in third} == {STABLE}

        # 5. Fixed (the fault cleared), canaried again and promoted: every conversation on the new revision.
        env.fleet.engines[CANARY].set_faults(Faults())
        for step in (["canary", "--revision", CANARY, "--weight", "10"], ["promote"]):
            code, _, err = await llmfleet("model", *step, "--model", MODEL, *gate)
            assert code == 0, err
        promoted = Rollout(MODEL, CANARY)

        async def on_the_new_revision() -> bool:
            return canaries.rollouts.get(MODEL) == promoted

        await poll(on_the_new_revision, "the replica reads the promotion")
        fourth = await _load(env, key, range(400, 440))
        assert {a.revision for a in fourth} == {CANARY}
        answers = first + second + third + fourth
        await _settled(env, team_id, answers)

        # 6. The audit: every request of the team with its revision and node, never content.
        code, out, err = await llmfleet(
            "ops", "audit", "--database-url", migrated_db_url, "--team", "canary-team", "--json"
        )
        assert code == 0, err
        rows = [json.loads(line) for line in out.splitlines()]
        assert len(rows) == len(answers)
        assert Counter(r["revision"] for r in rows) == Counter(a.revision for a in answers)
        assert all(r["node"] for r in rows)
        assert "conversation" not in out  # the prompts' text never appears
