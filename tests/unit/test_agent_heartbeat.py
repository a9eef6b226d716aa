"""Heartbeats from the engine's /metrics (new and old KV names) and GPU telemetry that is
present only when measured."""

from __future__ import annotations

import asyncio
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from apps.agent.deps import AgentDeps
from apps.agent.engine import EngineLoad, parse_engine_metrics, tokenize_body
from apps.agent.telemetry import NvidiaSmiProbe, parse_dcgm, parse_nvidia_smi
from apps.core.protocol import node as proto
from tests.fakes.fake_engine import FakeEngine
from tests.fakes.fake_orchestrator import running_agent

VLLM_011 = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 4.0
vllm:num_requests_running{engine="1",model_name="m"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:num_requests_waiting{engine="1",model_name="m"} 5.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 1234.0
"""

VLLM_08 = """# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.5
"""


def test_parse_vllm_metrics_sums_engines_and_takes_the_fullest_kv() -> None:
    assert parse_engine_metrics(VLLM_011) == EngineLoad(queue_depth=7, kv_cache_usage=0.75, running=7)


def test_parse_old_kv_metric_name() -> None:
    assert parse_engine_metrics(VLLM_08) == EngineLoad(queue_depth=1, kv_cache_usage=0.5, running=0)


def test_no_vllm_metrics_is_none() -> None:
    assert parse_engine_metrics("# TYPE http_requests_total counter\nhttp_requests_total 3\n") is None


def test_tokenize_body_uses_the_chat_form() -> None:
    body = tokenize_body(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 9, "tools": []}
    )
    assert body == {
        "messages": [{"role": "user", "content": "x"}],
        "add_generation_prompt": True,
        "model": "m",
        "tools": [],
    }


def test_dcgm_and_nvidia_smi_parsers() -> None:
    dcgm = (
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="a",Hostname="h"} 40\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="b",Hostname="h"} 80\n'
    )
    util, count = parse_dcgm(dcgm)
    assert util == pytest.approx(0.6)
    assert count == 2
    assert parse_dcgm("") == (None, 0)
    assert parse_nvidia_smi("50\n70\n[N/A]\n") == [50.0, 70.0]


async def test_nvidia_smi_probe_runs_the_tool(tmp_path: Path) -> None:
    tool = tmp_path / "nvidia-smi"
    tool.write_text("#!/bin/sh\nprintf '20\\n60\\n'\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    probe = NvidiaSmiProbe(str(tool))
    assert await probe.utilization() == pytest.approx(0.4)
    assert await probe.count() == 2
    broken = NvidiaSmiProbe(str(tmp_path / "missing"))
    assert await broken.utilization() is None


class FixedGpu:
    async def utilization(self) -> float | None:
        return 0.42

    async def count(self) -> int | None:
        return 4


async def test_heartbeats_carry_engine_load_and_no_fake_gpu_util(tmp_path: Path) -> None:
    engine = FakeEngine(waiting=3, kv=0.5, old_kv_name=True)
    async with running_agent(tmp_path, engine=engine) as run:
        await run.orch.wait_for(lambda _: len(run.orch.of_type(proto.Heartbeat)) >= 2)
        beat = run.orch.of_type(proto.Heartbeat)[0]
        assert beat == proto.Heartbeat(
            queue_depth=3, kv_cache_usage=0.5, gpu_util=None, running=0, draining=False
        )


async def test_gpu_telemetry_when_available(tmp_path: Path) -> None:
    async with running_agent(tmp_path, deps=AgentDeps(gpu_probe=FixedGpu()), gpus=None) as run:
        await run.orch.wait_for(lambda _: bool(run.orch.of_type(proto.Heartbeat)))
        assert run.orch.of_type(proto.Heartbeat)[0].gpu_util == 0.42
        assert run.orch.registrations[0].gpus == 4


async def test_slow_metrics_keep_a_healthy_node_alive_a_dead_engine_goes_quiet(tmp_path: Path) -> None:
    engine = FakeEngine(waiting=2, kv=0.3)
    async with running_agent(tmp_path, engine=engine) as run:
        await run.orch.wait_for(lambda _: bool(run.orch.of_type(proto.Heartbeat)))
        engine.metrics_ok = False  # /metrics fails, /health still fine: last reading repeated
        n = len(run.orch.of_type(proto.Heartbeat))
        await run.orch.wait_for(lambda _: len(run.orch.of_type(proto.Heartbeat)) >= n + 3)
        assert run.orch.of_type(proto.Heartbeat)[-1].queue_depth == 2
        # Engine dead: the agent stops heartbeating so the orchestrator takes the node out.
        # Observed through the agent's own scrape-failure counter, which keeps rising while
        # no heartbeat is sent.
        engine.healthy = False
        registry = run.agent.metrics.registry

        def failures() -> float:
            return registry.get_sample_value("llmfleet_agent_engine_scrape_failures_total") or 0.0

        start = failures()
        await poll_until(lambda: failures() >= start + 1)  # the first failed scrape after death
        beats_before = len(run.orch.of_type(proto.Heartbeat))
        await poll_until(lambda: failures() >= start + 5)  # four more heartbeat periods
        assert len(run.orch.of_type(proto.Heartbeat)) == beats_before


async def poll_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll with a deadline (for state that has no event to wait on)."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)
