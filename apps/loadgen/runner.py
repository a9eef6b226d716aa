"""`run_load(config) -> LoadReport`: closed-loop or open-loop load against an OpenAI-compatible URL.

Closed loop: `concurrency` workers, each sends its next request when the previous one ends (with
`ramp_s`, the workers' first requests are spread evenly over that time instead of arriving at once).
Open loop: Poisson arrivals at `rate` per second; at most `concurrency` in flight (an arrival that
finds none free waits, and its TTFT counts from its scheduled arrival, so client-side backlog
shows in the numbers instead of hiding it). Every task lives in one TaskGroup.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from apps.core.errors import Unavailable
from apps.loadgen.client import Outcome, RequestResult, stream_one
from apps.loadgen.config import LoadConfig
from apps.loadgen.prompts import make_prompt
from apps.loadgen.report import LoadReport


@dataclass(frozen=True)
class Progress:
    done: int
    total: int | None
    ok: int
    errors: int
    in_flight: int
    elapsed_s: float
    output_tokens: int


class Unreachable(Unavailable):
    """The target URL does not accept connections."""


async def preflight(config: LoadConfig, timeout_s: float = 5.0) -> None:
    """Fail fast, with the URL and the error, when nothing listens there."""
    parts = urlsplit(config.base_url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout=timeout_s)
    except (OSError, TimeoutError) as exc:
        reason = str(exc) or type(exc).__name__
        raise Unreachable(f"cannot reach {config.base_url}: {reason}", param="base_url") from None
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


def _body(config: LoadConfig, index: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": config.model,
        "messages": [{"role": "user", "content": make_prompt(config.prompt_tokens, index, config.seed)}],
        "max_tokens": config.max_tokens,
        "stream": True,
    }
    if config.include_usage:
        body["stream_options"] = {"include_usage": True}
    if config.ignore_eos:
        body["ignore_eos"] = True
    if config.tag is not None:
        body["user"] = request_user(config.tag, index)
    return body


def request_user(tag: str, index: int) -> str:
    """The `user` field of request `index` of a tagged run: unique within the run."""
    return f"{tag}-{index}"


class _Run:
    def __init__(self, config: LoadConfig, session: aiohttp.ClientSession) -> None:
        self.config = config
        self.session = session
        self.results: list[RequestResult] = []
        self.issued = 0
        self.in_flight = 0
        self.headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        self.t0 = time.monotonic()
        self.deadline = self.t0 + config.duration_s if config.duration_s is not None else None

    def next_index(self) -> int | None:
        total = self.config.total_requests
        if total is not None and self.issued >= total:
            return None
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return None
        self.issued += 1
        return self.issued - 1

    async def one(self, index: int, start: float) -> None:
        self.in_flight += 1
        try:
            result = await stream_one(
                self.session,
                self.config.chat_url,
                self.headers,
                _body(self.config, index),
                start,
                self.config.abandon_after,
                self.config.request_timeout_s,
            )
            self.results.append(result)
        finally:
            self.in_flight -= 1

    async def closed_loop(self) -> None:
        # With a ramp, worker k starts k/concurrency of the way through it: the streams' first requests
        # arrive evenly instead of in one burst, and later ones keep that spread (steady state).
        step = self.config.ramp_s / self.config.concurrency

        async def worker(k: int) -> None:
            if step:
                await asyncio.sleep(k * step)
            while (index := self.next_index()) is not None:
                await self.one(index, time.monotonic())

        async with asyncio.TaskGroup() as tg:
            for k in range(self.config.concurrency):
                tg.create_task(worker(k))

    async def open_loop(self) -> None:
        assert self.config.rate is not None
        rng = random.Random(self.config.seed)
        slots = asyncio.Semaphore(self.config.concurrency)
        due = time.monotonic()

        async def run_then_release(index: int, start: float) -> None:
            try:
                await self.one(index, start)
            finally:
                slots.release()

        async with asyncio.TaskGroup() as tg:
            while True:
                due += rng.expovariate(self.config.rate)
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                index = self.next_index()
                if index is None:
                    break
                await slots.acquire()
                tg.create_task(run_then_release(index, due))

    def progress(self) -> Progress:
        ok = sum(1 for r in self.results if r.outcome is not Outcome.ERROR)
        return Progress(
            done=len(self.results),
            total=self.config.total_requests,
            ok=ok,
            errors=len(self.results) - ok,
            in_flight=self.in_flight,
            elapsed_s=time.monotonic() - self.t0,
            output_tokens=sum(r.output_tokens for r in self.results),
        )


async def run_load(
    config: LoadConfig,
    on_progress: Callable[[Progress], None] | None = None,
    progress_interval_s: float = 0.5,
) -> LoadReport:
    """Run one load test and return its report (the library entry point for benchmarks and chaos tests)."""
    config.validate()
    await preflight(config)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        run = _Run(config, session)
        done = asyncio.Event()

        async def ticker() -> None:
            assert on_progress is not None
            while not done.is_set():
                on_progress(run.progress())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), timeout=progress_interval_s)
            on_progress(run.progress())

        async with asyncio.TaskGroup() as tg:
            if on_progress is not None:
                tg.create_task(ticker())
            try:
                await (run.open_loop() if config.rate is not None else run.closed_loop())
            finally:
                done.set()
        return LoadReport(config=config, duration_s=time.monotonic() - run.t0, results=run.results)
