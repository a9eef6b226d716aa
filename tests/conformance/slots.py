"""Requests queued in a paused engine, then let go at once: the priority checks' harness. Nothing in
it depends on how fast the engine or the machine is.

Why a pause: a check of the engine's scheduler needs several requests waiting together at the
moment the scheduler chooses. Holding engine slots with long answers and hoping they are still
running when the check looks raced the engine (a quiet machine finished them first). Instead the
engine is paused through its documented interface, vLLM 0.32's dev-mode routes
(`VLLM_SERVER_DEV_MODE=1`: `POST /pause?mode=keep`, `POST /resume`; enginesim serves the same with
`--dev-mode`): in mode "keep" the scheduler schedules nothing, so no request runs, ends or is
admitted until the check resumes it, however long the check takes.

Knowing a request arrived: the scheduler gauges (`vllm:num_requests_waiting`) are a snapshot of the
engine's last step, and a paused engine steps only when a request is aborted. So after starting a
request the check sends "pokes" (a one-token request whose connection is closed as soon as its
headers arrive: either it reached the engine and its abort makes a step, or it never reached the
engine and changes nothing) until the engine's own snapshot counts the request as waiting.

Reading the verdict afterwards, not while it happens: with the requests released together the
engine runs them to their end on its own; what it did is read from each request's own usage.
`prompt_tokens_details.cached_tokens` (`--enable-prompt-tokens-details`) is how much of the
prompt the engine found in its prefix cache when it first scheduled the request, so with prompts
that share a prefix, a request that found the prefix cached was scheduled after the one that
computed it (the pause cleared the cache: `clear_cache=true`). `iteration_tokens_total` (tokens
per engine step, summed) shows how many tokens the engine computed again after a preemption.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

# A queue of a few requests shows up within a few pokes on a quiet machine (measured: 1-2 pokes,
# 40-130 ms each); the deadline only bounds a broken engine.
QUEUE_DEADLINE_S = 120.0
POKE_PRIORITY = 1000  # behind everything, should a poke ever reach the scheduler unaborted


@dataclass(frozen=True)
class EngineState:
    running: int
    waiting: int
    finished: int  # requests that ended by themselves so far (aborts are not in it)
    preemptions: int = 0  # vllm:num_preemptions_total
    step_tokens: float = 0.0  # vllm:iteration_tokens_total's sum: tokens computed in all steps


@dataclass
class Outcome:
    """One request run to its end: its status and its final usage."""

    name: str
    status: int | None = None
    usage: dict[str, Any] | None = None
    content_chunks: int = 0
    ended: bool = False  # its `[DONE]` arrived
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def cached_tokens(self) -> int:
        assert self.usage is not None, f"{self.name}: no usage chunk"
        details = self.usage.get("prompt_tokens_details")
        assert details is not None, f"{self.name}: usage without prompt_tokens_details: {self.usage}"
        return int(details["cached_tokens"])


async def read_to_end(resp: httpx.Response, outcome: Outcome) -> None:
    """Read a streamed chat completion to `[DONE]`, noting its usage chunk."""
    try:
        outcome.status = resp.status_code
        if resp.status_code != 200:
            raise AssertionError(f"{outcome.name}: {resp.status_code} {(await resp.aread())[:500]!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                outcome.ended = True
                continue
            chunk = json.loads(payload)
            assert "error" not in chunk, (outcome.name, chunk)
            if chunk.get("usage") and not chunk.get("choices"):
                outcome.usage = chunk["usage"]
            elif any(c.get("delta", {}).get("content") for c in chunk.get("choices") or []):
                outcome.content_chunks += 1
    finally:
        await resp.aclose()


def chat_body(model: str, content: str, priority: int, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "priority": priority,
    }


def words(tag: str, count: int) -> str:
    """`count` words unique to this run (a prompt prefix no earlier request can have cached)."""
    return " ".join(f"{tag}{i}" for i in range(count))


def run_tag() -> str:
    """Eight letters unique to this run (letters: a tokenizer splits them into fewer tokens than
    hex digits, so prompts built from them stay well inside the context)."""
    return "".join(chr(ord("a") + int(c, 16)) for c in uuid.uuid4().hex[:8])


class PausedEngine:
    """One engine, paused: queue requests in a known order, then `release()` them all at once.

    One client for the requests (no keep-alive: each request its own connection, so closing it is
    that request's abort) and one for `/metrics` and the control routes."""

    def __init__(self, url: str, model: str) -> None:
        self.url = url
        self.model = model
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(300.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
        )
        self.control = httpx.AsyncClient(timeout=httpx.Timeout(60.0))
        self.outcomes: list[Outcome] = []
        self.pokes = 0
        self.paused = False

    # -- the engine's own state ---------------------------------------------------------------

    async def state(self) -> EngineState:
        text = (await self.control.get(f"{self.url}/metrics")).text
        found = dict.fromkeys(
            ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:num_preemptions_total"), 0.0
        )
        finished = step_tokens = 0.0
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name in found:
                    found[s.name] += s.value
                elif s.name == "vllm:request_success_total" and s.labels.get("finished_reason") != "abort":
                    finished += s.value
                elif s.name == "vllm:iteration_tokens_total_sum":
                    step_tokens += s.value
        return EngineState(
            int(found["vllm:num_requests_running"]),
            int(found["vllm:num_requests_waiting"]),
            int(finished),
            int(found["vllm:num_preemptions_total"]),
            step_tokens,
        )

    async def _control(self, path: str, **params: str) -> None:
        resp = await self.control.post(f"{self.url}{path}", params=params)
        assert resp.status_code == 200, (path, resp.status_code, resp.text)

    # -- pause, queue, release -------------------------------------------------------------------

    async def pause(self) -> None:
        """Pause an idle engine ("keep": nothing is scheduled) and empty its prefix cache."""
        await self.until(lambda s: (s.running, s.waiting) == (0, 0), "an idle engine")
        await self._control("/pause", mode="keep", clear_cache="true")
        self.paused = True

    async def freeze(self) -> None:
        """Pause the engine as it is ("keep", cache kept): running requests stay running, waiting
        ones waiting, and nothing moves until `release()`."""
        await self._control("/pause", mode="keep", clear_cache="false")
        self.paused = True

    async def release(self) -> None:
        await self._control("/resume")
        self.paused = False

    def start(self, name: str, send: Callable[[httpx.AsyncClient], Awaitable[httpx.Response]]) -> Outcome:
        """A request sent with `send` on the request client and read to its end in a task."""
        outcome = Outcome(name)

        async def run() -> None:
            await read_to_end(await send(self.client), outcome)

        outcome.task = asyncio.create_task(run(), name=name)
        self.outcomes.append(outcome)
        return outcome

    def chat(
        self, name: str, content: str, priority: int, max_tokens: int, cache_salt: str | None = None
    ) -> Outcome:
        """A streamed `POST /v1/chat/completions` straight to the engine (`cache_salt`: share cached
        blocks with the platform's requests of that team, which carry its scope as their salt)."""
        body = chat_body(self.model, content, priority, max_tokens)
        if cache_salt is not None:
            body["cache_salt"] = cache_salt
        req = self.client.build_request("POST", f"{self.url}/v1/chat/completions", json=body)
        return self.start(name, lambda client: client.send(req, stream=True))

    async def queued(self, outcome: Outcome) -> EngineState:
        """Return once the paused engine's own snapshot counts every request started so far as
        waiting (the last one, `outcome`, included), poking it for snapshots."""
        assert self.paused, "queue requests in a paused engine"
        want = len(self.outcomes)
        return await self.until(
            lambda s: (s.running, s.waiting) == (0, want),
            f"{outcome.name} queued as request {want}",
            poke=True,
        )

    async def _poke(self) -> None:
        self.pokes += 1
        body = chat_body(self.model, "poke", POKE_PRIORITY, 1)
        async with self.client.stream("POST", f"{self.url}/v1/chat/completions", json=body) as resp:
            assert resp.status_code == 200, (resp.status_code, await resp.aread())
        # Leaving the block closes the connection unread: the engine aborts the poke.

    async def until(
        self, predicate: Callable[[EngineState], bool], what: str, poke: bool = False
    ) -> EngineState:
        """Read the engine's state until `predicate` holds (AssertionError at the deadline, or at
        once when a started request failed)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + QUEUE_DEADLINE_S
        last: EngineState | None = None
        while True:
            self.raise_failures()
            last = await self.state()
            if predicate(last):
                return last
            if loop.time() > end:
                raise AssertionError(
                    f"{what}: not within {QUEUE_DEADLINE_S} s (engine: {last}, pokes: {self.pokes})"
                )
            if poke:
                await self._poke()
            else:
                await asyncio.sleep(0.01)  # polling interval with a deadline: the engine state has no event

    def raise_failures(self) -> None:
        for o in self.outcomes:
            if o.task is not None and o.task.done() and not o.task.cancelled() and o.task.exception():
                raise AssertionError(f"{o.name} failed: {o.task.exception()!r}")

    async def all_ended(self, deadline_s: float = 300.0) -> None:
        """Every started request read to its `[DONE]` (its failure, if one failed)."""
        tasks = [o.task for o in self.outcomes if o.task is not None]
        _, pending = await asyncio.wait(tasks, timeout=deadline_s)
        self.raise_failures()
        assert not pending, f"not ended within {deadline_s} s: {[t.get_name() for t in pending]}"

    async def close(self) -> None:
        for o in self.outcomes:
            if o.task is not None:
                o.task.cancel()
        for o in self.outcomes:
            if o.task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await o.task
        if self.paused:  # a failed check must not leave the session's engine paused
            with contextlib.suppress(Exception):
                await self._control("/resume")
        await self.client.aclose()
        await self.control.aclose()


@contextlib.asynccontextmanager
async def paused_engine(url: str, model: str) -> AsyncIterator[PausedEngine]:
    """A `PausedEngine` paused on entry; resumed and its requests cancelled on exit."""
    engine = PausedEngine(url, model)
    try:
        await engine.pause()
        yield engine
    finally:
        await engine.close()
