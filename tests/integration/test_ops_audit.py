"""`llmfleet ops audit` on the real platform in-process (gateway, orchestrator, agent, enginesim,
PostgreSQL, Redis; issue 30 item 4): each ledger row names the node whose report settled it and the
model revision its agent said it serves, and the command prints who, which key, which revision,
which node, tokens and cost, never content; bad input is one line and exit 2."""

from __future__ import annotations

import json
from typing import Any

import pytest

from apps.cli.main import main
from apps.core.protocol.dispatch import MODEL_REVISION_HEADER
from tests.fleet import MODEL, REVISION
from tests.gateway_env import GatewayEnv
from tests.integration.gateway_fixtures import client, gateway

__all__ = ["gateway"]  # the fixture, imported for pytest
pytestmark = pytest.mark.timeout(120)

SECRET_WORDS = "the-audit-must-never-print-this-prompt"


async def _chat(env: GatewayEnv, key: str, request_id: str, tokens: int) -> None:
    async with client(env) as c:
        r = await c.post(
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": SECRET_WORDS}],
                "max_tokens": tokens,
                "ignore_eos": True,
            },
            headers={"Authorization": f"Bearer {key}", "x-request-id": request_id},
        )
        assert r.status_code == 200, r.text
        answer = r.json()["choices"][0]["message"]["content"]
        assert answer
        assert r.headers[MODEL_REVISION_HEADER] == REVISION  # which version answered
    await env.settled()


def _audit(capsys: pytest.CaptureFixture[str], env: GatewayEnv, *args: str) -> tuple[int, str, str]:
    code = main(["ops", "audit", "--database-url", env.settings.database_url, *args])
    out = capsys.readouterr()
    return code, out.out, out.err


async def _key_prefix(env: GatewayEnv, team_id: int) -> str:
    async with env.pool.connection() as conn:
        cur = await conn.execute("SELECT prefix FROM api_keys WHERE team_id = %s", (team_id,))
        row = await cur.fetchone()
    assert row is not None
    return str(row[0])


async def test_each_row_names_its_node_and_revision_and_the_audit_prints_them_never_content(
    gateway: GatewayEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    env = gateway
    team_a, key_a = await env.team_with_key("audit-a", name="ci-pipeline")
    _, key_b = await env.team_with_key("audit-b")
    await _chat(env, key_a, "audit-req-0001", 4)
    await _chat(env, key_a, "audit-req-0002", 6)
    await _chat(env, key_b, "audit-req-0001", 3)  # the same client id in another team

    code, out, err = _audit(capsys, env, "--request-id", "audit-req-0001", "--team", "audit-a", "--json")
    assert (code, err) == (0, "")
    row: dict[str, Any] = json.loads(out)
    node_ids = await _node_ids(env)
    assert row["request_id"] == f"t{team_a}/audit-req-0001"
    assert row["team"] == "audit-a"
    assert row["team_id"] == team_a
    assert row["key"] == f"{await _key_prefix(env, team_a)}… (ci-pipeline)"
    assert (row["model"], row["revision"], row["status"]) == (MODEL, REVISION, "settled")
    assert row["node"].startswith("gw-node-")
    assert row["node"] in node_ids
    assert row["completion_tokens"] == 4
    assert row["prompt_tokens"] == await env.fleet.prompt_tokens([{"role": "user", "content": SECRET_WORDS}])
    assert float(row["cost_credits"]) > 0
    assert SECRET_WORDS not in out
    assert key_a not in out

    # The team's window: its two requests, oldest first, the other team's not among them.
    code, out, err = _audit(capsys, env, "--team", "audit-a", "--from=-1h", "--to", "now")
    assert (code, err) == (0, "")
    lines = out.strip().splitlines()
    assert lines[0].split()[:2] == ["request", "reserved"]
    assert [line.split()[0] for line in lines[1:]] == [
        f"t{team_a}/audit-req-0001",
        f"t{team_a}/audit-req-0002",
    ]
    assert all(REVISION in line and "settled" in line for line in lines[1:])
    assert SECRET_WORDS not in out
    assert key_b not in out

    # More than --limit: the first rows, and a line on stderr saying so.
    code, out, err = _audit(capsys, env, "--team", str(team_a), "--limit", "1", "--json")
    assert code == 0
    assert len(out.strip().splitlines()) == 1
    assert "more than 1 requests matched" in err


async def test_a_stream_names_its_revision_in_a_header(gateway: GatewayEnv) -> None:
    _, key = await gateway.team_with_key("audit-stream")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
    async with (
        client(gateway) as c,
        c.stream("POST", "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as r,
    ):
        assert r.status_code == 200
        assert r.headers[MODEL_REVISION_HEADER] == REVISION
        text = "".join([part async for part in r.aiter_text()])
    assert text.rstrip().endswith("data: [DONE]")
    await gateway.settled()


async def _node_ids(env: GatewayEnv) -> list[str]:
    async with env.pool.connection() as conn:
        cur = await conn.execute("SELECT id FROM nodes")
        return [str(r[0]) for r in await cur.fetchall()]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "--request-id ID, or --team T"),
        (
            ("--request-id", "no-such-request-1"),
            "no request 'no-such-request-1' in the ledger (an id its client",
        ),
        (("--team", "no-such-team"), "--team: no team 'no-such-team'"),
        (("--team", "audit-a", "--limit", "0"), "--limit must be greater than 0"),
        (("--team", "audit-a", "--from", "now", "--to=-1h"), "empty window"),
        (("--team", "audit-a", "--from", "last tuesday"), "is not a time"),
    ],
)
async def test_bad_input_is_one_line_and_exit_2(
    gateway: GatewayEnv, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str
) -> None:
    await gateway.team_with_key("audit-a")
    code, out, err = _audit(capsys, gateway, *args)
    assert code == 2
    assert out == ""
    assert err.startswith("llmfleet ops: error: "), err
    assert err.count("\n") == 1, err
    assert message in err


async def test_an_unreachable_ledger_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["ops", "audit", "--request-id", "x", "--database-url", "postgresql://nobody@127.0.0.1:1/x"])
    err = capsys.readouterr().err
    assert code == 2
    assert "ledger database not reachable" in err
    assert err.count("\n") == 1


def test_no_database_is_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMFLEET_DATABASE_URL", raising=False)
    code = main(["ops", "audit", "--request-id", "x"])
    err = capsys.readouterr().err
    assert code == 2
    assert "no ledger database" in err
