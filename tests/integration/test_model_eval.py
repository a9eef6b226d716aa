"""Issue 30 item 2, the evaluation gate, on the local platform: the real gateway and orchestrator,
one node agent and enginesim engine per revision (the bad candidate's engine has other "weights": another
seed), the registry on moto's S3, a local signing key, and the commands a platform engineer types.

The golden set is recorded from the stable revision (pinned, as an admin does). `llmfleet model eval`
passes the good candidate and fails the bad one, each with a signed result next to its manifest; the
gate refuses to give the failed one canary traffic and lets the good one through to promotion. Only
an admin may pin a revision: a team's key gets 403 and nothing is reserved."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from apps.core.rollouts import RolloutStore
from apps.core.scheduling.canary import Rollout
from apps.modelsync.manifest import EVAL_NAME
from tests.commands import llmfleet
from tests.e2e.test_gateway_sdk import sdk
from tests.fleet import MODEL, FleetSetup
from tests.gateway_env import gateway_env
from tests.unit.s3_mock import key_pair, mock_bucket

pytestmark = pytest.mark.timeout(180)
BUCKET = "llmfleet-models"
STABLE, GOOD, BAD = "r-stable", "r-good", "r-bad"
PROMPTS = ["Capital of France?", "Two plus two?", "Name a colour.", "Say hello."]
PIN = "x-llmfleet-model-revision"


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with mock_bucket(monkeypatch, BUCKET) as client:
        yield client


async def _answer(client: openai.AsyncOpenAI, prompt: str, revision: str) -> tuple[str, str]:
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=8,
        temperature=0,
        extra_headers={PIN: revision},
    )
    completion = raw.parse()
    return completion.choices[0].message.content or "", raw.headers[PIN]


async def record_golden(client: openai.AsyncOpenAI, revision: str, path: Path) -> list[str]:
    """The golden set as a release engineer records it: `PROMPTS` answered by `revision` (pinned),
    written as a suite of `exact` cases at `path`; the answers come back."""
    answers = [await _answer(client, p, revision) for p in PROMPTS]
    assert {served for _, served in answers} == {revision}
    cases = [
        {
            "name": f"case-{i}",
            "messages": [{"role": "user", "content": p}],
            "max_tokens": 8,
            "expect": {"exact": t},
        }
        for i, (p, (t, _)) in enumerate(zip(PROMPTS, answers, strict=True))
    ]
    path.write_text(yaml.safe_dump({"name": "golden", "cases": cases}))
    return [text for text, _ in answers]


async def publish(revision: str, tmp_path: Path, registry: list[str]) -> None:
    """`llmfleet model publish` of a one-file revision."""
    weights = tmp_path / revision
    weights.mkdir()
    (weights / "model.safetensors").write_bytes(revision.encode() * 64)
    code, _, err = await llmfleet(
        "model", "publish", "--model", MODEL, "--revision", revision, "--from", str(weights), *registry
    )
    assert code == 0, err


async def test_eval_passes_the_good_candidate_blocks_the_bad_one_and_gates_canary_and_promote(
    migrated_db_url: str, redis_url: str, s3: Any, tmp_path: Path
) -> None:
    keys = key_pair(tmp_path)
    # Three agents, three engines, the replica and the gateway share one event loop: on a loaded
    # machine a heartbeat comes late; liveness is not this test's subject.
    setup = FleetSetup(revisions=(STABLE, GOOD, BAD), seeds={BAD: 7}, orchestrator={"missed_heartbeats": 10})
    async with gateway_env(migrated_db_url, redis_url, serve=True, fleet=setup) as env:
        team_id, team_key = await env.team_with_key("product-team")
        evaluators = (await env.deps.teams.create_team("evaluators")).id
        await env.deps.teams.add_credits(evaluators, 1_000_000_000)
        admin = env.issuer.mint("release-bot", team="evaluators", admin=True)
        store = RolloutStore(env.pool)
        # The candidates are staged without traffic: the model's production goes to the stable.
        await store.start(MODEL, GOOD, 0, STABLE, "test")

        # 1. Only an admin pins; a team's key is refused before anything is reserved.
        funds = await env.balance(team_id)
        async with sdk(env, team_key) as client:
            with pytest.raises(openai.PermissionDeniedError) as refused:
                await _answer(client, PROMPTS[0], BAD)
        assert refused.value.code == "revision_pin_forbidden"
        assert await env.balance(team_id) == funds
        suite = tmp_path / "golden.yaml"
        async with sdk(env, admin) as client:
            with pytest.raises(openai.BadRequestError):
                await _answer(client, PROMPTS[0], "../r-stable")
            with pytest.raises(openai.InternalServerError) as missing:  # 503, at once
                await _answer(client, PROMPTS[0], "r-nowhere")
            assert missing.value.status_code == 503
            assert missing.value.code == "revision_not_served"

            # 2. The golden set, recorded from the stable revision (pinned: the answer says which).
            golden = await record_golden(client, STABLE, suite)
            # The bad candidate answers otherwise (what the gate must catch).
            assert [(await _answer(client, p, BAD))[0] for p in PROMPTS] != golden

        # 3. Publish both candidates, evaluate each.
        registry = ["--bucket", BUCKET, "--signing-key", str(keys.private)]
        for revision in (GOOD, BAD):
            await publish(revision, tmp_path, registry)
        evaluate = ["model", "eval", "--model", MODEL, "--suite", str(suite), "--stack", "dev", *registry]
        evaluate += ["--base-url", env.base_url + "/v1", "--api-key", admin, "--actor", "release-bot"]
        canary_picks = env.fleet.orchestrator.plane.metrics.canary_picks
        picks_before = canary_picks.labels(MODEL, GOOD)._value.get()
        code, out, err = await llmfleet(*evaluate, "--revision", GOOD)
        assert code == 0, err
        record = json.loads(out)
        assert (record["passed"], record["pass_ratio"], record["failed_cases"]) == (True, 1.0, [])
        assert record["url"] == f"s3://{BUCKET}/{MODEL}/{GOOD}/{EVAL_NAME}"
        # The evaluation's traffic is not the canary's: the judge saw none of it.
        assert canary_picks.labels(MODEL, GOOD)._value.get() == picks_before

        code, out, err = await llmfleet(*evaluate, "--revision", BAD)
        assert code == 1, err
        record = json.loads(out)
        assert record["passed"] is False
        assert record["failed_cases"]  # its answers are not the golden ones
        signed = json.loads(s3.get_object(Bucket=BUCKET, Key=f"{MODEL}/{BAD}/{EVAL_NAME}")["Body"].read())
        assert signed["evaluation"]["passed"] is False
        assert signed["signature"]["value"]
        assert PROMPTS[0] not in json.dumps(signed)  # the result names cases, never content

        # 4. The gate: the failed revision gets no canary traffic; the good one goes on to promotion.
        rollout = ["--database-url", migrated_db_url, "--bucket", BUCKET, "--verify-key", str(keys.public)]
        await store.rollback(MODEL, GOOD, "test", "make room for the next candidate")
        code, out, err = await llmfleet(
            "model", "canary", "--model", MODEL, "--revision", BAD, "--weight", "10", *rollout
        )
        assert (code, out) == (2, "")
        assert len(err.strip().splitlines()) == 1
        assert f"{MODEL} revision {BAD} failed its evaluation" in err
        code, _, err = await llmfleet(
            "model", "canary", "--model", MODEL, "--revision", GOOD, "--weight", "10", *rollout
        )
        assert code == 0, err
        code, out, err = await llmfleet("model", "promote", "--model", MODEL, *rollout)
        assert code == 0, err
        assert await store.get(MODEL) == Rollout(MODEL, GOOD)

        # The evaluation was billed to the evaluators' team, not the product team.
        assert await env.balance(team_id) == funds
        assert await env.balance(evaluators) < 1_000_000_000
