"""Shutdown of a vLLM pod: the preStop hook waits for the agent's drain, bounded by the budget."""

from __future__ import annotations

import socket
import subprocess
import sys

from apps.cli.procs import free_port as _free_port
from apps.core.sizing.plan import plan_fleet
from apps.core.spec import load_spec
from infra.manifests.node_agent import SPOT_HANDOFF_S, SPOT_NOTICE_S, agent_drain_s
from infra.manifests.vllm import deployment, wait_for_agent_exit
from infra.manifests.vllm_target import Capacity, timing


def test_hook_returns_at_once_when_the_agent_is_gone() -> None:
    # A budget far beyond the test timeout: the hook must not be waiting for it.
    proc = subprocess.run(
        [sys.executable, "-c", wait_for_agent_exit(100_000, _free_port())], timeout=60, check=False
    )
    assert proc.returncode == 0


def test_hook_waits_while_the_agent_listens_and_returns_when_it_closes() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        port = int(server.getsockname()[1])
        proc = subprocess.Popen([sys.executable, "-c", wait_for_agent_exit(100_000, port)])
        server.settimeout(60)
        conn, _ = server.accept()  # the hook is polling: the agent is still "draining"
        conn.close()
        assert proc.poll() is None
    # listener closed = the agent exited
    assert proc.wait(timeout=60) == 0


def test_grace_period_covers_drain_and_vllm_shutdown() -> None:
    for name, mp in plan_fleet(load_spec("prod")).models.items():
        tm = timing(mp)
        assert tm.stream_budget_s * mp.tokens_per_s_per_stream >= mp.max_model_len, name
        assert tm.shutdown_timeout_s > tm.stream_budget_s
        assert tm.grace_period_s > tm.stream_budget_s + tm.shutdown_timeout_s
        assert tm.startup_failure_threshold * 10 >= 300


def test_a_spot_pods_agent_drains_within_the_interruption_notice() -> None:
    """On a Spot reclaim the node goes two minutes after the notice: the agent's drain must end
    (handing its unfinished streams to other nodes) with time left for them to take over."""
    for name, mp in plan_fleet(load_spec("prod")).models.items():
        tm = timing(mp)
        assert agent_drain_s(tm, Capacity.ON_DEMAND) == tm.stream_budget_s, name
        spot = agent_drain_s(tm, Capacity.SPOT)
        assert spot <= SPOT_NOTICE_S - SPOT_HANDOFF_S, name
        assert spot == min(tm.stream_budget_s, SPOT_NOTICE_S - SPOT_HANDOFF_S), name


def test_the_rendered_spot_deployment_passes_the_spot_drain_bound() -> None:
    from infra.manifests.vllm_target import VllmTarget

    mp = plan_fleet(load_spec("prod")).models["llama-3.1-8b-instruct"]
    target = VllmTarget(mp, "rev", "vllm:img", "agent:img", "bucket")
    for capacity in (Capacity.SPOT, Capacity.ON_DEMAND):
        spec = deployment(target, capacity, None)["spec"]["template"]["spec"]
        (agent,) = [c for c in spec["containers"] if c["name"] == "agent"]
        args = agent["args"]
        drain = int(args[args.index("--drain-timeout") + 1])
        assert drain == agent_drain_s(timing(mp), capacity)
        # The pod's grace period still covers the drain and vLLM's shutdown.
        assert spec["terminationGracePeriodSeconds"] > drain
