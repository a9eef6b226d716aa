"""The agent against the real engine simulator process (`llmfleet enginesim`): usage,
chunk counting and abort-on-cancel agree with what the engine itself reports."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from apps.agent.engine import parse_engine_metrics
from apps.cli.procs import free_port as _free_port
from apps.core.protocol import node as proto
from tests.fakes.fake_orchestrator import running_agent

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # a second process


@dataclass
class SimEngine:
    """An enginesim process, for the harness (`running_agent` takes any engine with these two)."""

    model: str
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
async def enginesim() -> AsyncIterator[SimEngine]:
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "apps.cli.main", "enginesim", "--model", "tiny", "--profile", "tiny",
        "--port", str(port), "--max-num-seqs", "8", "--max-model-len", "1024", "--seed", "1",
        cwd=REPO, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    sim = SimEngine(model="tiny", port=port)
    try:
        async with asyncio.timeout(60), aiohttp.ClientSession() as s:
            while True:
                assert proc.returncode is None, "enginesim exited during start"
                try:
                    async with s.get(f"{sim.url}/health") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)  # poll with a deadline: the process has no ready event
        yield sim
    finally:
        proc.terminate()
        await proc.wait()


async def _running(url: str) -> int:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        load = parse_engine_metrics(await r.text())
    assert load is not None
    return load.running


async def test_usage_and_chunks_match_enginesim(tmp_path: Path, enginesim: SimEngine) -> None:
    async with running_agent(tmp_path, engine=enginesim, max_num_seqs=8) as run:
        assert run.orch.registrations[0].models[0].max_model_len == 1024  # from /v1/models
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 12}
        await run.orch.send(proto.Assign(request_id="s1", model="tiny", body=body))
        done = await run.result("s1", timeout=30)
        assert isinstance(done, proto.Done), done
        assert done.usage_event is not None
        assert done.completion_tokens == run.chunks("s1").count("data: ") - 1  # one chunk per token
        assert done.completion_tokens <= 12
        assert done.prompt_tokens > 0
        # /tokenize agrees with the engine's own prompt count (what an abort would bill)
        async with aiohttp.ClientSession() as s:
            payload = {"model": "tiny", "messages": body["messages"], "add_generation_prompt": True}
            async with s.post(f"{enginesim.url}/tokenize", json=payload) as r:
                assert (await r.json())["count"] == done.prompt_tokens


async def test_cancel_aborts_inside_enginesim(tmp_path: Path, enginesim: SimEngine) -> None:
    async with running_agent(tmp_path, engine=enginesim, max_num_seqs=8) as run:
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": "tell me a long story"}],
            "max_tokens": 900,
            "ignore_eos": True,
        }
        await run.orch.send(proto.Assign(request_id="s2", model="tiny", body=body))
        await run.orch.wait_for(lambda _: run.chunks("s2").count("data: ") >= 3, timeout=30)
        await run.orch.send(proto.Cancel(request_id="s2"))
        done = await run.result("s2", timeout=30)
        assert isinstance(done, proto.Done)
        assert done.finish_reason == "abort"
        assert done.completion_tokens == run.chunks("s2").count("data: ") - 1
        assert 2 <= done.completion_tokens < 900
        async with asyncio.timeout(10):
            while await _running(enginesim.url) != 0:  # the engine freed the request
                await asyncio.sleep(0.05)
