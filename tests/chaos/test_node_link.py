"""Chaos 3 and 7, with a TCP proxy between one agent and its orchestrator.

3. The agent's WebSocket is cut: nothing is sent to the node while it is gone, its in-flight
   streams end (error event, or a retry when no chunk had reached the client), it reconnects
   with backoff (attempts spread out, not a tight loop) and is routed to again.
7. The agent finishes requests whose `done_ack` never arrives (the proxy swallows
   server -> agent bytes), is killed, restarts on the same journal and replays: usage is
   settled once — not zero times, not twice.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time

import pytest

from apps.cli.platform import Engine, LocalPlatform
from apps.loadgen.runner import run_load
from tests.chaos.conftest import PlatformFactory
from tests.chaos.helpers import (
    balance_consistent,
    engine_admitted,
    engine_running,
    engines_running,
    http_post_json,
    http_text,
    ledger_totals,
    load_8b,
    metric_sum,
    orchestrators_metric,
    redial_agents,
    settled_rows,
    wait_until,
)
from tests.chaos.proxy import TcpProxy

pytestmark = pytest.mark.chaos

CUT_S = 5.0


def _proxied_platform(
    make_platform: PlatformFactory, proxies: list[TcpProxy]
) -> tuple[LocalPlatform, Engine, TcpProxy]:
    """A platform whose on-premises node's agent dials orchestrator 0 through a fresh proxy."""
    platform = make_platform()
    engine = next(e for e in platform.engines.values() if e.spec.location == "onprem")
    proxy = TcpProxy(platform.orchestrator_ports[0])
    proxies.append(proxy)
    proxy.start()
    redial_agents(platform, proxy.port, [engine.spec.node_id])
    return platform, engine, proxy


def _running(engine: Engine) -> float:
    return engine_running(engine.url)


def test_cut_websocket_reconnects_with_backoff_and_gets_nothing_while_gone(
    make_platform: PlatformFactory, proxies: list[TcpProxy], migrated_db_url: str
) -> None:
    platform, engine, proxy = _proxied_platform(make_platform, proxies)
    node_id = engine.spec.node_id
    config = load_8b(platform, concurrency=30, requests=150, prompt_tokens=128, max_tokens=1500)
    out: dict[str, dict[str, object]] = {}
    load = threading.Thread(target=lambda: out.update(r=asyncio.run(run_load(config)).to_json()))
    load.start()
    try:
        wait_until(lambda: _running(engine) >= 3, 60, "streams on the proxied node")
        proxy.cut()
        cut_at = time.monotonic()
        # The agent aborts what it was relaying (its chunks can no longer reach anyone).
        wait_until(lambda: _running(engine) == 0, 30, "the cut node's engine idle")
        admitted_while_gone = engine_admitted(engine.url)
        # Stay cut for a while: long enough for several backoff windows (1, 2, 4 s).
        wait_until(
            lambda: time.monotonic() - cut_at >= CUT_S and len(_attempts(proxy.refused)) >= 3,
            30,
            "three reconnect attempts",
        )
        assert (
            engine_admitted(engine.url) == admitted_while_gone
        )  # nothing was sent to the node while it was gone
        attempts = _attempts(proxy.refused)
        proxy.restore()
        platform.wait_nodes_ready([node_id], 70)
    finally:
        load.join(240)
    gaps = [round(b - a, 2) for a, b in itertools.pairwise(attempts)]
    print(f"reconnect attempts in {CUT_S:.0f} s cut: {len(attempts)}, gaps {gaps} s")
    # Full-jitter backoff (windows 1, 2, 4 s...): a handful of attempts, never a tight loop.
    assert len(attempts) <= 8
    _assert_exponential_full_jitter(platform.agents[node_id].log_path.read_text(), gaps)
    report = out["r"]
    requests = report["requests"]
    assert isinstance(requests, dict)
    print("load during the cut:", requests, report["errors_by_status"])
    # Only streams already relaying from the cut node fail, and they fail with an error event
    # (no hang, no timeout); everything else — retried or routed elsewhere — succeeds.
    errors_by_status = report["errors_by_status"]
    assert isinstance(errors_by_status, dict)
    assert set(errors_by_status) <= {"stream_error"}
    assert requests["error"] <= config.concurrency
    assert requests["ok"] + requests["error"] == 150
    wait_until(lambda: ledger_totals(migrated_db_url).reserved == 0, 60, "no reservation left open")
    rows = settled_rows(migrated_db_url)
    partial = [r for r in rows if r[2] < config.max_tokens]
    assert len(rows) == 150
    assert len(partial) == requests["error"]  # each failed stream billed for the tokens it got
    balance, expected = balance_consistent(migrated_db_url)
    assert balance == expected


def _assert_exponential_full_jitter(agent_log: str, gaps: list[float]) -> None:
    """The agent's own schedule for this outage (its `reconnecting` lines): the window doubles from
    the base (1, 2, 4 s... — growth), each delay is a uniform draw below its window (plus a
    refusal's `retry_after_s`), the draws are not one fixed value (jitter), and the proxy saw the
    dials at least that far apart (the delays were really slept). A fixed 1 s retry fails the
    growth and the jitter checks."""
    lines = [json.loads(line) for line in agent_log.splitlines() if line.startswith("{")]
    schedule = [entry for entry in lines if entry.get("msg") == "reconnecting"]
    # The cut's run of attempts: the last one starting at attempt 1 (the first after a session).
    starts = [i for i, entry in enumerate(schedule) if entry["attempt"] == 1]
    assert starts, f"no reconnect schedule in the agent's log: {schedule}"
    run = schedule[starts[-1] :]
    assert len(run) >= 3, run
    windows = [entry["window_s"] for entry in run]
    jitter = [entry["delay_s"] - (entry.get("retry_after_s") or 0.0) for entry in run]
    assert [entry["attempt"] for entry in run] == list(range(1, len(run) + 1))
    assert windows == [min(60.0, 2.0**i) for i in range(len(run))], windows  # exponential growth
    assert all(0.0 <= j <= w for j, w in zip(jitter, windows, strict=True)), (jitter, windows)
    fractions = {round(j / w, 2) for j, w in zip(jitter, windows, strict=True)}
    assert len(fractions) > 1, f"every delay the same fraction of its window: no jitter ({jitter})"
    assert len(set(jitter)) == len(jitter), f"a fixed retry delay, not a random draw: {jitter}"
    # Dial k + 1 follows dial k by attempt k + 1's delay: the proxy's first to last refused dial span
    # at least the delays slept in between (dials merged by `_attempts` only shorten the sum).
    delays = [entry["delay_s"] for entry in run]
    assert sum(gaps) >= sum(delays[1 : len(gaps) + 1]) - 0.2, (gaps, delays)


def _attempts(accepts: list[float]) -> list[float]:
    """Dial attempts: accepts closer than 0.1 s are one attempt (the client's immediate retry)."""
    out: list[float] = []
    for t in accepts:
        if not out or t - out[-1] > 0.1:
            out.append(t)
    return out


def test_agent_restart_with_unacknowledged_dones_settles_once(
    make_platform: PlatformFactory, proxies: list[TcpProxy], migrated_db_url: str
) -> None:
    platform, engine, proxy = _proxied_platform(make_platform, proxies)
    node_id = engine.spec.node_id
    config = load_8b(platform, concurrency=5, requests=5, prompt_tokens=64, max_tokens=300)
    for e in platform.engines.values():  # every stream pauses 3 s after 5 tokens: a window to act in
        http_post_json(e.url + "/_sim/faults", {"stall_s": 3.0, "stall_after_tokens": 5, "times": 5})
    out: dict[str, dict[str, object]] = {}
    load = threading.Thread(target=lambda: out.update(r=asyncio.run(run_load(config)).to_json()))
    load.start()
    try:
        # On-premises nodes are filled first, so most (usually all) land on the proxied node.
        wait_until(lambda: engines_running(platform) == 5, 60, "all five streams running")
        on_node = int(_running(engine))
        proxy.drop_downstream = True  # from now on no done_ack reaches the agent
    finally:
        load.join(120)
    report = out["r"]
    assert report["requests"] == {"total": 5, "ok": 5, "error": 0, "abandoned": 0}, report["errors_by_status"]
    wait_until(lambda: ledger_totals(migrated_db_url).settled == 5, 30, "five settles")
    first = sorted(settled_rows(migrated_db_url))
    health = platform.agent_health_ports[node_id]
    pending = metric_sum(http_text(f"http://127.0.0.1:{health}/metrics"), "llmfleet_agent_journal_pending")
    assert on_node >= 1
    assert pending == on_node  # finished, settled, but never acknowledged

    agent = platform.agents[node_id]
    agent.popen.kill()  # a crash: no drain, no goodbye
    agent.popen.wait(10)
    platform.stop_child(agent)
    platform.agent_urls.pop(node_id)
    platform.start_agent(node_id)  # same journal file, straight to the orchestrator
    platform.wait_nodes_ready([node_id], 60)
    health = platform.agent_health_ports[node_id]
    wait_until(
        lambda: (
            metric_sum(http_text(f"http://127.0.0.1:{health}/metrics"), "llmfleet_agent_journal_pending") == 0
        ),
        30,
        "the replayed dones acknowledged",
    )
    settles = orchestrators_metric(platform, "llmfleet_orchestrator_settles_total")
    assert settles >= 5 + on_node  # five settles, then the replays, which were no-ops
    assert sorted(settled_rows(migrated_db_url)) == first  # once: same rows, same tokens
    totals = ledger_totals(migrated_db_url)
    assert totals.settled == 5
    assert totals.reserved == 0
    assert totals.completion_tokens == 5 * 300
    engines_total = sum(
        metric_sum(http_text(e.url + "/metrics"), "vllm:generation_tokens_total")
        for e in platform.engines.values()
    )
    assert totals.completion_tokens == engines_total
    balance, expected = balance_consistent(migrated_db_url)
    assert balance == expected
