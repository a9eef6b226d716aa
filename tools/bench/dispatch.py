"""The gateway's upstream client, old (aiohttp) against new (raw protocol + httptools), side by side.

Method: one fake orchestrator in a child process (`tools.bench.wire`: a raw asyncio protocol,
keep-alive, that answers each dispatch POST with the head and the first two chunks at once and then
one chunk every `--spacing-ms`); in THIS process both dispatchers take turns, alternating rounds
(old, new, old, new, ...) after one unmeasured warm-up round each (connections pooled). A round is
`--streams` concurrent requests, each `open()` + read every chunk + `aclose()`, like the relay.
Per round: this process's user+system CPU (resource.getrusage, so the server's CPU is not in it)
divided by the HTTP chunks the server sent, and per request the latency of `open()` + first chunk.
Reported: the median over rounds of CPU seconds per 1,000 chunks, and p50/p99 latency over all
requests of the variant. The machine is shared: compare the two columns of the same run only.

    .venv/bin/python -m tools.bench dispatch [--streams 200] [--chunks 64] [--spacing-ms 20] [--rounds 6]
    .venv/bin/python -m tools.bench dispatch --chunks 2 --spacing-ms 0      # per-request cost
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from apps.core.protocol.dispatch import DISPATCH_PATH, DispatchRequest
from apps.gateway.dispatcher import HttpDispatcher
from apps.gateway.ports import DispatchUnavailable
from tools.bench.common import Supervisor, loop_factory, pct, self_cpu_seconds
from tools.bench.wire import start_fake_orchestrator


# ------------------------------------------------------------------ baseline: the aiohttp dispatcher
# A copy of apps/gateway/dispatcher.py before the raw-protocol client replaced it.
class _Chunks:
    def __init__(self, content: aiohttp.StreamReader) -> None:
        self._content = content

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> bytes:
        try:
            data = await self._content.readany()
        except aiohttp.ClientError as exc:
            raise ConnectionError(str(exc)) from exc
        if not data:
            raise StopAsyncIteration
        return data


class AiohttpUpstream:
    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status
        self.headers: Mapping[str, str] = {k.lower(): v for k, v in response.headers.items()}

    def chunks(self) -> AsyncIterator[bytes]:
        return _Chunks(self._response.content)

    async def read_body(self) -> bytes:
        try:
            return await self._response.read()
        except aiohttp.ClientError as exc:
            raise ConnectionError(str(exc)) from exc

    async def aclose(self) -> None:
        self._response.close()


class AiohttpDispatcher:
    def __init__(self, urls: Sequence[str], internal_token: str, *, limit: int = 2000) -> None:
        if not urls:
            raise ValueError("at least one orchestrator URL is required")
        self._urls = [u.rstrip("/") for u in urls]
        self._next = itertools.cycle(range(len(self._urls)))
        self._token = internal_token
        self._limit = limit
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._limit, limit_per_host=self._limit),
                timeout=aiohttp.ClientTimeout(total=None, connect=5),
                auto_decompress=False,
            )
        return self._session

    async def open(self, request: DispatchRequest) -> AiohttpUpstream:
        session = self._get_session()
        payload = request.model_dump_json().encode()
        headers = {"Authorization": f"Bearer {self._token}", "Content-Type": "application/json"}
        start = next(self._next)
        last: Exception | None = None
        for i in range(len(self._urls)):
            url = self._urls[(start + i) % len(self._urls)] + DISPATCH_PATH
            try:
                response = await session.post(url, data=payload, headers=headers)
            except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as exc:
                last = exc
                continue
            return AiohttpUpstream(response)
        raise DispatchUnavailable(f"no orchestrator reachable: {last}")

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


# ------------------------------------------------------------------ the measurement
class _Upstream(Protocol):
    def chunks(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class _Dispatcher(Protocol):
    async def open(self, request: DispatchRequest) -> Any: ...

    async def aclose(self) -> None: ...


def _request(i: int) -> DispatchRequest:
    body = {"model": "llama-3.1-8b-instruct", "messages": [{"role": "user", "content": "hi " * 40}]}
    return DispatchRequest(request_id=f"bench-{i:08d}", team_id=1, key_id=1, model=body["model"], body=body)


async def _one(dispatcher: _Dispatcher, request: DispatchRequest, latencies: list[float]) -> int:
    t0 = time.perf_counter()
    upstream: _Upstream = await dispatcher.open(request)
    pieces = 0
    try:
        async for _data in upstream.chunks():
            if pieces == 0:
                latencies.append(time.perf_counter() - t0)
            pieces += 1
    finally:
        await upstream.aclose()
    return pieces


async def _round(dispatcher: _Dispatcher, streams: int, latencies: list[float]) -> tuple[float, int]:
    requests = [_request(i) for i in range(streams)]
    cpu0 = self_cpu_seconds()
    pieces = await asyncio.gather(*(_one(dispatcher, r, latencies) for r in requests))
    return self_cpu_seconds() - cpu0, sum(pieces)


async def bench(url: str, args: argparse.Namespace) -> None:
    variants: dict[str, Callable[[], _Dispatcher]] = {
        "old (aiohttp)": lambda: AiohttpDispatcher([url], "internal"),
        "new (raw protocol)": lambda: HttpDispatcher([url], "internal"),
    }
    dispatchers = {name: make() for name, make in variants.items()}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    latency: dict[str, list[float]] = {name: [] for name in variants}
    pieces: dict[str, int] = dict.fromkeys(variants, 0)
    chunks_per_round = args.streams * args.chunks
    try:
        for dispatcher in dispatchers.values():  # warm-up: pooled connections, imports, caches
            await _round(dispatcher, args.streams, [])
        for r in range(args.rounds):
            order = list(dispatchers.items()) if r % 2 == 0 else list(reversed(dispatchers.items()))
            for name, dispatcher in order:
                spent, got = await _round(dispatcher, args.streams, latency[name])
                cpu[name].append(spent / chunks_per_round * 1000)
                pieces[name] += got
                print(f"  round {r + 1} {name:20s} cpu {spent:.3f} s", flush=True)
    finally:
        for dispatcher in dispatchers.values():
            await dispatcher.aclose()
    print()
    print(
        f"{args.streams} concurrent streams x {args.chunks} HTTP chunks, {args.spacing_ms} ms apart, "
        f"{args.rounds} measured rounds per variant, loop {args.loop}"
    )
    print(
        f"{'variant':20s} {'CPU s/1k chunks':>16s} {'(min..max)':>16s} {'open+1st p50 ms':>16s} "
        f"{'p99 ms':>8s} {'reads/resp':>10s}"
    )
    for name in variants:
        med = statistics.median(cpu[name])
        reads = pieces[name] / (args.rounds * args.streams)
        print(
            f"{name:20s} {med:16.4f} {min(cpu[name]):7.4f}..{max(cpu[name]):7.4f} "
            f"{pct(latency[name], 0.5) * 1000:16.3f} {pct(latency[name], 0.99) * 1000:8.3f} {reads:10.1f}"
        )
    old, new = (statistics.median(cpu[n]) for n in variants)
    print(f"new/old CPU per chunk: {new / old:.2f}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--chunks", type=int, default=64, help="HTTP chunks per response (>= 2)")
    parser.add_argument("--spacing-ms", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--loop", choices=["uvloop", "asyncio"], default="uvloop", help="the gateway runs uvloop"
    )
    args = parser.parse_args(argv)
    if args.chunks < 2:
        parser.error("--chunks must be at least 2 (role chunk and the final chunk)")
    tokens = args.chunks - 2  # wire.sse_frames: role, tokens, finish + [DONE]
    print(__doc__)
    with tempfile.TemporaryDirectory(prefix="llmfleet-bench-") as tmp:
        supervisor = Supervisor(Path(tmp))
        try:
            _, port = start_fake_orchestrator(supervisor, tokens, args.spacing_ms, args.loop)
            with asyncio.Runner(loop_factory=loop_factory(args.loop)) as runner:
                runner.run(bench(f"http://127.0.0.1:{port}", args))
        finally:
            supervisor.stop_all()


if __name__ == "__main__":
    main()
