"""Raw-protocol pieces of the gateway benchmark: a fake zero-latency orchestrator that streams
pre-encoded vLLM-like SSE frames, and a keep-alive streaming client that timestamps the first
content chunk. Both are bare asyncio protocols (uvloop when available), so that the benchmark's
own processes cost little next to the gateway they measure (`tools.bench.gateway`, `tools.bench.dispatch`).

The fake runs as a child process: `start_fake_orchestrator` (or `python -m tools.bench.wire --port P ...`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
import uuid
from typing import cast

from tools.bench.common import Child, Supervisor, free_port, loop_factory, module_argv

MODEL = "llama-3.1-8b-instruct"
MARK = b'"content":"t'  # present in content chunks only (the role chunk's content is "")
CHUNKED_END = b"\r\n0\r\n\r\n"
_CONTENT_LENGTH = re.compile(rb"content-length:\s*(\d+)")


# ---------------------------------------------------------------- fake orchestrator
def sse_frames(tokens: int) -> list[bytes]:
    """Pre-encoded HTTP chunks: role, `tokens` content chunks, finish + [DONE], terminator."""
    rid = "chatcmpl-" + uuid.uuid4().hex

    def event(delta: dict[str, object], finish: str | None = None) -> bytes:
        obj = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": 0,
            "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"

    def chunk(payload: bytes) -> bytes:
        return b"%x\r\n" % len(payload) + payload + b"\r\n"

    frames = [chunk(event({"role": "assistant", "content": ""}))]
    frames += [chunk(event({"content": f"t{i} "})) for i in range(tokens)]
    frames.append(chunk(event({}, "stop") + b"data: [DONE]\n\n") + b"0\r\n\r\n")
    return frames


STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


class FakeOrchestrator(asyncio.Protocol):
    """One keep-alive connection; one stream at a time (clients do not pipeline)."""

    def __init__(self, frames: list[bytes], interval_s: float) -> None:
        self._frames = frames
        self._interval = interval_s
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._next = 0
        self._t0 = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it

    def data_received(self, data: bytes) -> None:
        self._buf += data
        while True:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self._buf[:end]).lower()
            m = _CONTENT_LENGTH.search(head)
            size = int(m.group(1)) if m else 0
            if len(self._buf) < end + 4 + size:
                return
            del self._buf[: end + 4 + size]
            assert self._transport is not None
            if head.startswith(b"post"):
                self._start()
            else:
                self._transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")

    def _start(self) -> None:
        assert self._transport is not None
        if self._interval <= 0:
            self._transport.write(STREAM_HEAD + b"".join(self._frames))
            return
        self._transport.write(STREAM_HEAD + self._frames[0] + self._frames[1])
        self._next = 2
        self._t0 = asyncio.get_running_loop().time()
        self._schedule()

    def _schedule(self) -> None:
        loop = asyncio.get_running_loop()
        # call_at on the ideal grid: no cumulative drift, exactly 1 / interval tokens per second.
        self._timer = loop.call_at(self._t0 + (self._next - 1) * self._interval, self._tick)

    def _tick(self) -> None:
        assert self._transport is not None
        if self._transport.is_closing():
            return
        self._transport.write(self._frames[self._next])
        self._next += 1
        if self._next < len(self._frames):
            self._schedule()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()


async def serve_fake(port: int, tokens: int, interval_ms: float) -> None:
    frames = sse_frames(tokens)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: FakeOrchestrator(frames, interval_ms / 1000), "127.0.0.1", port, backlog=4096
    )
    async with server:
        await server.serve_forever()


# ---------------------------------------------------------------- load client
class StreamClient(asyncio.Protocol):
    """One keep-alive client connection issuing one streaming request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.lost = asyncio.get_running_loop().create_future()
        self._buf = bytearray()
        self._done: asyncio.Future[tuple[int, float | None, int]] | None = None
        self._t0 = 0.0
        self._ttft: float | None = None
        self._status = 0
        self._body_at = -1
        self._length: int | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def request(self, raw: bytes) -> asyncio.Future[tuple[int, float | None, int]]:
        assert self.transport is not None
        self._buf.clear()
        self._ttft, self._status, self._body_at, self._length = None, 0, -1, None
        self._done = asyncio.get_running_loop().create_future()
        self._t0 = time.perf_counter()
        self.transport.write(raw)
        return self._done

    def data_received(self, data: bytes) -> None:
        start = max(len(self._buf) - len(MARK), 0)
        self._buf += data
        if self._body_at < 0:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self._buf[:end]).lower()
            self._status = int(head[9:12])
            self._body_at = end + 4
            m = _CONTENT_LENGTH.search(head)
            self._length = int(m.group(1)) if m else None
        if self._ttft is None and self._status == 200 and self._buf.find(MARK, start) >= 0:
            self._ttft = time.perf_counter() - self._t0
        complete = (
            len(self._buf) >= self._body_at + self._length
            if self._length is not None
            else self._buf.endswith(CHUNKED_END)
        )
        if complete and self._done is not None and not self._done.done():
            self._done.set_result((self._status, self._ttft, self._buf.count(MARK)))

    def connection_lost(self, exc: Exception | None) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_exception(ConnectionError("connection lost"))
        if not self.lost.done():
            self.lost.set_result(None)


def request_bytes(port: int, path: str, key: str, tokens: int) -> bytes:
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "bench"}],
            "max_tokens": tokens,
            "stream": True,
        }
    ).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


async def one_round(
    port: int, raw: bytes, streams: int, requests: int, stagger_s: float
) -> tuple[list[float], int, int]:
    loop = asyncio.get_running_loop()
    ttfts: list[float] = []
    errors = 0
    chunks = 0

    async def client(i: int) -> None:
        nonlocal errors, chunks
        # Spread the clients' start over one request duration so arrivals are steady, not one burst.
        await asyncio.sleep(stagger_s * i / streams)
        conn: StreamClient | None = None
        for _ in range(requests):
            try:
                if conn is None or conn.lost.done():
                    _, conn = await loop.create_connection(StreamClient, "127.0.0.1", port)
                status, ttft, n = await conn.request(raw)
            except OSError:
                errors += 1
                conn = None
                continue
            if status != 200 or ttft is None:
                errors += 1
                continue
            ttfts.append(ttft)
            chunks += n
        if conn is not None and conn.transport is not None:
            conn.transport.close()

    async with asyncio.TaskGroup() as tg:
        for i in range(streams):
            tg.create_task(client(i))
    return ttfts, errors, chunks


# ---------------------------------------------------------------- the fake as a child process
def start_fake_orchestrator(
    supervisor: Supervisor, tokens: int, interval_ms: float, loop: str = "uvloop"
) -> tuple[Child, int]:
    """The fake orchestrator in its own process, listening; returns it and its port."""
    port = free_port()
    argv = module_argv("tools.bench.wire", "--port", str(port), "--tokens", str(tokens))
    argv += ["--interval-ms", str(interval_ms), "--loop", loop]
    child = supervisor.start("fake-orchestrator", argv)
    supervisor.wait_http_ok(child, f"http://127.0.0.1:{port}/", timeout_s=20)
    return child, port


def main() -> None:
    parser = argparse.ArgumentParser(description="the fake zero-latency orchestrator (a benchmark's child)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokens", type=int, required=True, help="content chunks per response")
    parser.add_argument("--interval-ms", type=float, required=True, help="0: the whole response at once")
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    args = parser.parse_args()
    with asyncio.Runner(loop_factory=loop_factory(args.loop)) as runner:
        runner.run(serve_fake(args.port, args.tokens, args.interval_ms))


if __name__ == "__main__":
    main()
