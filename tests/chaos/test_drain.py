"""Chaos 6: drain a node under load: it gets no new assignments, its streams finish, then it
leaves (the agent exits 0 and the node is no longer `ready`)."""

from __future__ import annotations

import asyncio
import threading
import urllib.error
import urllib.request

import pytest

from apps.loadgen.runner import run_load
from tests.chaos.conftest import PlatformFactory
from tests.chaos.helpers import (
    engine_admitted,
    engine_running,
    http_post_json,
    http_text,
    load_8b,
    metric_sum,
    wait_until,
)

pytestmark = pytest.mark.chaos


def _readyz_status(base: str) -> int:
    try:
        with urllib.request.urlopen(base + "/readyz", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_drain_under_load_finishes_streams_sends_nothing_new_then_the_node_leaves(
    make_platform: PlatformFactory,
) -> None:
    platform = make_platform()
    onprem = next(e for e in platform.engines.values() if e.spec.location == "onprem")
    node_id = onprem.spec.node_id
    config = load_8b(platform, concurrency=60, requests=240, prompt_tokens=128, max_tokens=200)
    result: dict[str, object] = {}
    runner = threading.Thread(target=lambda: result.update(report=asyncio.run(run_load(config)).to_json()))
    runner.start()
    try:
        wait_until(lambda: engine_running(onprem.url) >= 5, 60, "the on-prem node busy")
        status, _ = http_post_json(
            platform.orchestrator_url(0) + f"/internal/v1/nodes/{node_id}/drain",
            {},
            token=platform.secrets["internal_token"],
        )
        assert status == 202
        health = f"http://127.0.0.1:{platform.agent_health_ports[node_id]}"
        wait_until(lambda: _readyz_status(health) == 503, 10, "the agent draining (readiness off)")
        agent_metrics = http_text(health + "/metrics")
        # What the agent had taken on when it started draining: finished + still running.
        accepted_at_drain = metric_sum(agent_metrics, "llmfleet_agent_in_flight") + sum(
            metric_sum(agent_metrics, "llmfleet_agent_assignments_total", outcome=o)
            for o in ("completed", "aborted", "failed")
        )
        agent = platform.agents[node_id]
        assert agent.popen.wait(timeout=90) == 0  # its streams finished, it reported, it exited
        # Nothing new reached the engine after the drain began (and none of it is still running:
        # every stream it had finished before the agent exited).
        assert 0 < engine_admitted(onprem.url) <= accepted_at_drain
        assert engine_running(onprem.url) == 0
    finally:
        runner.join(180)
    report = result["report"]
    assert isinstance(report, dict)
    assert report["requests"]["error"] == 0, report["errors_by_status"]
    assert report["requests"]["ok"] == 240
    nodes = {n["node_id"]: n for n in platform.list_nodes()}
    assert node_id not in nodes or nodes[node_id]["state"] != "ready"
