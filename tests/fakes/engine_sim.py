"""The real engine simulator (`apps.enginesim`) in-process for the agent's tests, not a fake: a
`tiny` engine on a free port, and what the tests read of it through its own API and `/metrics`.

`speed` slows the simulated clock (0.2: about 200 tokens/s per stream), so that a stream of
`ENDLESS` tokens outlasts what a test does with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp

from apps.enginesim.faults import Faults
from apps.enginesim.server import EngineSimSettings, RunningEngine, start_enginesim

MODEL = "tiny"
ENDLESS = 1000  # max_tokens of a stream that outlasts a test (tiny's max_model_len is 1024)
MESSAGES = [{"role": "user", "content": "hi"}]


def body(tokens: int | None = None, *, endless: bool = False, **extra: Any) -> dict[str, Any]:
    """A chat body for the engine: exactly `tokens` tokens (or `ENDLESS`), each its own chunk."""
    out: dict[str, Any] = {"model": MODEL, "messages": MESSAGES, **extra}
    if tokens is not None or endless:
        out |= {"max_tokens": ENDLESS if endless else tokens, "ignore_eos": True}
    return out


@dataclass
class SimEngine:
    running: RunningEngine
    model: str = MODEL

    @property
    def url(self) -> str:
        return self.running.url

    def set_faults(self, faults: Faults) -> None:
        self.running.set_faults(faults)

    def busy(self) -> int:
        """Requests the engine is running or holds waiting."""
        sched = self.running.state.engine.scheduler
        return len(sched.running) + len(sched.waiting)

    async def idle(self, timeout: float = 10.0) -> None:
        """Until the engine runs nothing (after a cancel: the request was aborted)."""
        async with asyncio.timeout(timeout):
            while self.busy():
                await asyncio.sleep(0.01)  # poll with a deadline: the engine has no idle event

    async def metric(self, name: str) -> float:
        """The sum of `name`'s samples on the engine's `/metrics`."""
        async with aiohttp.ClientSession() as s, s.get(f"{self.url}/metrics") as resp:
            text = await resp.text()
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
                total += float(line.rsplit(" ", 1)[1])
        return total

    async def finished(self) -> float:
        """Requests the engine completed (aborted ones are not counted, as in vLLM)."""
        return await self.metric("vllm:request_success_total")

    async def pause(self) -> None:
        """vLLM's dev-mode `POST /pause?mode=keep` (the engine needs `dev_mode=True`): requests
        already running and new ones wait in the scheduler until `resume()`."""
        await self._post("/pause?mode=keep")

    async def resume(self) -> None:
        await self._post("/resume")

    async def _post(self, path: str) -> None:
        async with aiohttp.ClientSession() as s, s.post(f"{self.url}{path}") as resp:
            assert resp.status == 200, await resp.text()

    async def prompt_tokens(self, messages: list[dict[str, str]] = MESSAGES) -> int:
        """What the engine counts for `messages` (its `/tokenize`)."""
        async with (
            aiohttp.ClientSession() as s,
            s.post(f"{self.url}/tokenize", json={"model": self.model, "messages": messages}) as resp,
        ):
            return int((await resp.json())["count"])


@asynccontextmanager
async def engine_sim(speed: float = 0.2, *, model: str = MODEL, **settings: Any) -> AsyncIterator[SimEngine]:
    """`model`: the served name (its profile stays `tiny` unless `settings` name another)."""
    settings.setdefault("profile", "tiny")
    running = await start_enginesim(EngineSimSettings(model=model, port=0, speed=speed, **settings))
    try:
        yield SimEngine(running, model)
    finally:
        await running.close()
