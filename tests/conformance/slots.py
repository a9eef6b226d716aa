"""Engine slots held and freed on purpose, and the engine's own scheduler state: what the priority
checks need to observe vLLM's scheduler without depending on timing.

A `Held` request is a streamed chat completion running as a task: it notes when its first content
chunk arrived (the engine scheduled it), then stops reading; cancelling it closes its connection,
which makes the engine abort the request and free its slot (the engine's next step admits the head
of its waiting queue). `EngineState` is read from the engine's `/metrics`: the scheduler's running
and waiting counts after its last step, and how many requests finished by themselves
(`vllm:request_success_total`, stop + length: aborts are not in it). So "these requests all wait
at the same moment" and "no slot freed except the one we freed" are the engine's own statements,
not inferred from when HTTP responses arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

# Long enough to hold a slot through a whole check (the tiny model makes one token per engine step:
# 1,000 steps took ~1.8 s on enginesim, 9 s on the real vLLM on a loaded 2-core VM, and under 3 s on a
# quiet one, which made the checks inconclusive: hence 2,000), short enough to fit max-model-len 2048
# with the chat template around a one-word prompt.
HOLD_TOKENS = 2000


class Inconclusive(Exception):
    """A request ended by itself during a check: a slot freed that the check did not free."""


@dataclass(frozen=True)
class EngineState:
    running: int
    waiting: int
    finished: int  # requests that ended by themselves so far (not aborted)
    preemptions: int = 0  # vllm:num_preemptions_total


@dataclass
class Held:
    name: str
    streaming: bool = False  # its first content chunk arrived: the engine has scheduled it
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    def release(self) -> None:
        """Close the connection: the engine aborts the request and frees its slot."""
        assert self.task is not None
        self.task.cancel()


async def _hold(held: Held, response: Awaitable[httpx.Response]) -> None:
    """Read up to the first content chunk, then hold the connection without reading until cancelled.

    Not reading keeps the test process idle (eight streams of the tiny model are thousands of
    chunks a second); both engines go on generating into their own per-request buffers."""
    resp = await response
    try:
        assert resp.status_code == 200, (held.name, resp.status_code, (await resp.aread())[:500])
        # Stepped by hand and kept referenced: leaving an `async for` early would close the
        # iterator, and with it the connection (an abort).
        lines = resp.aiter_lines()
        while not held.streaming:
            line = await anext(lines)
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                choice = (json.loads(line[5:]).get("choices") or [{}])[0]
                held.streaming = bool(choice.get("delta", {}).get("content"))
        await asyncio.Event().wait()  # until released (cancelled)
        del lines
    finally:
        await resp.aclose()  # unread: the connection is closed, not pooled


class Holder:
    """Starts `Held` requests against one engine and cancels every one still open on exit.

    One client for all (a new httpx client costs ~0.1 s of CPU on a loaded VM); no keep-alive,
    so each request has its own connection and closing it is that request's abort."""

    def __init__(self, url: str) -> None:
        self.url = url  # the engine's
        self.held: list[Held] = []
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(120.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
        )
        self.reader = httpx.AsyncClient(timeout=httpx.Timeout(60.0))  # /metrics, kept alive
        self.baseline: int | None = None  # finished requests when the check began

    async def begin(self) -> None:
        """Wait for an idle engine (earlier tests' aborts land) and note its finished count: from
        now on a request ending by itself makes the check `Inconclusive`."""
        self.baseline = (await self.until_state(0, 0)).finished

    def run(self, name: str, work: Callable[[Held], Awaitable[None]]) -> Held:
        """A held request whose task is `work(held)` (cancelled on exit)."""
        held = Held(name)
        held.task = asyncio.create_task(work(held), name=name)  # type: ignore[arg-type]
        self.held.append(held)
        return held

    def start(self, name: str, request: Callable[[httpx.AsyncClient], Awaitable[httpx.Response]]) -> Held:
        """Send `request` on the shared client and hold it (`_hold`)."""
        return self.run(name, lambda held: _hold(held, request(self.client)))

    def chat(self, body: dict[str, Any], name: str) -> Held:
        """A streamed `POST /v1/chat/completions` straight to the engine."""
        req = self.client.build_request("POST", f"{self.url}/v1/chat/completions", json=body)
        return self.start(name, lambda client: client.send(req, stream=True))

    def failed(self) -> list[str]:
        """Requests whose task ended with an error (a refused request, a broken stream)."""
        return [
            f"{h.name}: {h.task.exception()!r}"
            for h in self.held
            if h.task is not None and h.task.done() and not h.task.cancelled() and h.task.exception()
        ]

    async def engine_state(self) -> EngineState:
        text = (await self.reader.get(f"{self.url}/metrics")).text
        found = dict.fromkeys(
            (
                "vllm:num_requests_running",
                "vllm:num_requests_waiting",
                "vllm:num_preemptions_total",
                "finished",
            ),
            0.0,
        )
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name in found:
                    found[s.name] += s.value
                elif s.name == "vllm:request_success_total" and s.labels.get("finished_reason") != "abort":
                    found["finished"] += s.value
        state = EngineState(
            int(found["vllm:num_requests_running"]),
            int(found["vllm:num_requests_waiting"]),
            int(found["finished"]),
            int(found["vllm:num_preemptions_total"]),
        )
        if self.baseline is not None and state.finished != self.baseline:
            raise Inconclusive(f"{state.finished - self.baseline} request(s) ended by themselves: {state}")
        return state

    async def until_state(self, running: int, waiting: int, deadline_s: float = 60.0) -> EngineState:
        """Poll the engine until it reports `running` and `waiting` (AssertionError at the deadline,
        or at once when one of the held requests failed)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline_s
        last: EngineState | None = None
        while loop.time() < end:
            assert not self.failed(), self.failed()
            last = await self.engine_state()
            if (last.running, last.waiting) == (running, waiting):
                return last
            await asyncio.sleep(0.01)  # polling interval with a deadline: the engine state has no event
        raise AssertionError(
            f"engine never had {running} running, {waiting} waiting within {deadline_s} s: {last}"
        )

    async def until(self, predicate: Callable[[], bool], what: str, deadline_s: float = 60.0) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline_s
        while not predicate():
            assert not self.failed(), self.failed()
            if loop.time() > end:
                raise AssertionError(f"{what}: not within {deadline_s} s")
            await asyncio.sleep(0.01)  # polling interval with a deadline: stream progress has no event

    async def close(self) -> None:
        tasks = [h.task for h in self.held if h.task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.client.aclose()
        await self.reader.aclose()


@contextlib.asynccontextmanager
async def holder(url: str) -> AsyncIterator[Holder]:
    h = Holder(url)
    try:
        yield h
    finally:
        await h.close()


async def conclusively(url: str, check: Callable[[Holder], Awaitable[None]], attempts: int = 3) -> None:
    """Run `check` until one run is conclusive (none of its held requests ended by itself, which a
    machine slow enough to let 1,000 engine steps pass during a check could cause); every run
    starts from an idle engine. A failed assertion fails at once: only `Inconclusive` is retried."""
    reasons = []
    for _ in range(attempts):
        async with holder(url) as held:
            try:
                await held.begin()
                await check(held)
                return
            except Inconclusive as exc:
                reasons.append(str(exc))
                print(f"inconclusive run, repeated: {exc}")  # shown with the test's output
    raise AssertionError(f"no conclusive run in {attempts}: {reasons}")


def hold_body(model: str, name: str, priority: int, max_tokens: int = HOLD_TOKENS) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": name}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "priority": priority,
    }
