"""Chaos: streams resumed on another node when their node is lost mid-answer (issue 16).

One platform, two nodes of the 8B model (the victim's agent dials through a TCP proxy), and four
waves of 50 streams each, the victim failing a different way in each: enginesim's
`error_after_tokens` (vLLM's in-stream error event), `die_after_tokens` (the engine's connection
drops), the node's WebSocket going silent (the proxy swallows both directions: missed heartbeats),
and the engine process killed. The victim's streams first stall after `K` tokens (enginesim
`stall_s`), so the test knows exactly which streams are on it before it fails them.

Every stream completes with its requested length and one role chunk, one `id`, one usage chunk
saying so; the ledger bills every request once for exactly what its client received and records
the re-prefill only on the resumed ones; the resume metric counts exactly the victim's streams.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import psycopg
import pytest

from apps.cli.platform import MODEL_8B, Engine, LocalPlatform, NodeSpec
from tests.chaos.conftest import PlatformFactory
from tests.chaos.helpers import (
    balance_consistent,
    engine_running,
    http_post_json,
    ledger_totals,
    orchestrators_metric,
    redial_agents,
    wait_until,
)
from tests.chaos.proxy import TcpProxy

pytestmark = pytest.mark.chaos

STREAMS = 50
MAX_TOKENS = 30
K = 5  # the victim's streams stall after this many tokens (and then fail)
STALL_S = 6.0  # long enough for every stream to start and the test to see who waits where


@dataclass
class StreamResult:
    tokens: int = 0
    text: str = ""
    ids: set[str] = field(default_factory=set)
    roles: int = 0
    usages: list[dict[str, int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    done: bool = False


async def _one(
    client: httpx.AsyncClient, platform: LocalPlatform, wave: str, i: int, out: StreamResult
) -> None:
    assert platform.credentials is not None
    body = {
        "model": MODEL_8B,
        "messages": [{"role": "user", "content": f"wave {wave} story {i}"}],
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"Authorization": f"Bearer {platform.credentials.api_key}"}
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            if "error" in obj:
                out.errors.append(obj["error"].get("message", ""))
                continue
            out.ids.add(obj["id"])
            if obj.get("usage"):
                out.usages.append(obj["usage"])
            for choice in obj.get("choices", []):
                delta = choice.get("delta", {})
                if "role" in delta:
                    out.roles += 1
                    continue
                out.tokens += 1
                out.text += delta.get("content") or ""
    out.done = True


def _run_wave(platform: LocalPlatform, wave: str, results: list[StreamResult]) -> threading.Thread:
    async def main() -> None:
        limits = httpx.Limits(max_connections=STREAMS + 5)
        async with httpx.AsyncClient(base_url=platform.gateway_url, timeout=120, limits=limits) as client:
            await asyncio.gather(*(_one(client, platform, wave, i, r) for i, r in enumerate(results)))

    thread = threading.Thread(target=lambda: asyncio.run(main()), name=f"wave-{wave}")
    thread.start()
    return thread


def _resumes(platform: LocalPlatform, **labels: str) -> float:
    return orchestrators_metric(platform, "llmfleet_orchestrator_resumes_total", **labels)


def _resumed_rows(db_url: str) -> int:
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT count(*) FROM usage_ledger WHERE resume_prompt_tokens > 0").fetchone()
    assert row is not None
    return int(row[0])


def _wave(
    platform: LocalPlatform,
    victim: Engine,
    wave: str,
    faults: dict[str, Any],
    fail: Callable[[], None],
    reason: str,
) -> int:
    """50 streams; the victim's stall after K tokens; `fail()` then fails them. Returns how many
    were on the victim, after checking every stream completed whole."""
    before = _resumes(platform, reason=reason, outcome="completed")
    status, _ = http_post_json(victim.url + "/_sim/faults", {"stall_after_tokens": K, **faults})
    assert status == 200
    results = [StreamResult() for _ in range(STREAMS)]
    thread = _run_wave(platform, wave, results)
    try:
        # Everything not on the victim finishes; everything on it waits at K tokens.
        seen: dict[str, object] = {}

        def settled_in() -> int | None:
            # The victim's streams wait at exactly K tokens (its engine's scheduler may have run
            # them to the end already: the stall is in the HTTP handler); the rest finish. The
            # same set twice, half a second apart (a passing stream would have moved on).
            unfinished = [i for i, r in enumerate(results) if not r.done]
            seen.update(unfinished=len(unfinished), tokens=sorted(results[i].tokens for i in unfinished))
            ok = bool(unfinished) and all(results[i].tokens == K for i in unfinished)
            if not ok or seen.get("candidate") != unfinished:
                seen["candidate"] = unfinished if ok else None
                return None
            return len(unfinished)

        try:
            on_victim = int(wait_until(settled_in, 60, f"{wave}: the victim's streams stalled", every_s=0.5))
        except AssertionError:
            print(wave, seen)
            raise
        http_post_json(victim.url + "/_sim/faults", {})  # new requests are not faulted (none come)
        fail()
    finally:
        thread.join(120)
    assert not thread.is_alive()
    for r in results:
        assert r.done, (wave, r)
        assert not r.errors, (wave, r)
        assert r.tokens == MAX_TOKENS, (wave, r)
        assert r.roles == 1, (wave, r)
        assert len(r.ids) == 1, (wave, r)
        assert [u["completion_tokens"] for u in r.usages] == [MAX_TOKENS], (wave, r)
        assert len(r.text.split()) == MAX_TOKENS  # one word a token: nothing repeated at the seam
    resumed = _resumes(platform, reason=reason, outcome="completed") - before
    print(f"wave {wave}: {on_victim} of {STREAMS} streams on the victim, {resumed:.0f} resumed ({reason})")
    assert resumed == on_victim
    return on_victim


def test_streams_on_a_lost_node_finish_on_the_other_node_and_are_billed_once(
    make_platform: PlatformFactory, proxies: list[TcpProxy], migrated_db_url: str
) -> None:
    nodes = [
        NodeSpec("resume-a", MODEL_8B, "cloud", max_num_seqs=64),
        NodeSpec("resume-b", MODEL_8B, "cloud", max_num_seqs=64),
    ]
    # Heartbeats every second: a silent node is dead to routing after two missed (2 s).
    platform = make_platform(nodes=nodes, orchestrator_env={"LLMFLEET_HEARTBEAT_INTERVAL_S": "1"})
    victim = platform.engines["resume-a"]
    proxy = TcpProxy(platform.orchestrator_ports[0])
    proxies.append(proxy)
    proxy.start()
    redial_agents(platform, proxy.port, ["resume-a"], ready=["resume-a", "resume-b"])
    t0 = time.monotonic()

    total = 0
    # 1. vLLM's in-stream error event after K + 1 tokens (the stall holds them at K first).
    total += _wave(
        platform,
        victim,
        "error",
        {"stall_s": STALL_S, "error_after_tokens": K + 1},
        lambda: None,
        "engine_error",
    )
    # 2. The engine's connection drops after K + 1 tokens.
    total += _wave(
        platform, victim, "die", {"stall_s": STALL_S, "die_after_tokens": K + 1}, lambda: None, "engine_error"
    )

    # 3. The node's WebSocket goes silent (no close, no RST): only missed heartbeats tell.
    def go_silent() -> None:
        proxy.silent = True

    total += _wave(platform, victim, "silent", {"stall_s": 10.0}, go_silent, "node_lost")
    proxy.cut()  # the agent notices now and dials again
    proxy.silent = False
    proxy.restore()
    wait_until(lambda: engine_running(victim.url) == 0, 30, "the victim's old streams gone")
    platform.wait_nodes_ready(["resume-a"], 60)

    # 4. The engine process is killed mid-stream.
    def kill() -> None:
        victim.child.popen.kill()
        victim.child.popen.wait(10)

    total += _wave(platform, victim, "kill", {"stall_s": 30.0}, kill, "engine_error")
    print(f"four waves in {time.monotonic() - t0:.1f} s, {total} streams resumed")
    assert total >= 4

    # Money: every request settled once, for exactly the tokens its client received; the re-prefill
    # is recorded on the resumed rows only; balances match the settled costs.
    totals = wait_until(
        lambda: (t := ledger_totals(migrated_db_url)).settled == 4 * STREAMS and t.reserved == 0 and t,
        60,
        "every request settled",
    )
    assert totals.completion_tokens == 4 * STREAMS * MAX_TOKENS
    assert _resumed_rows(migrated_db_url) == total
    assert _resumes(platform, outcome="failed") == 0
    assert _resumes(platform, outcome="no_node") == 0
    balance, expected = balance_consistent(migrated_db_url)
    assert balance == expected
