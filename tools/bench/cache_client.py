"""The client and the CPU clock of `tools.bench.cache`: one keep-alive HTTP/1.1 connection per arm that
sends one streaming request at a time and timestamps its response (first byte, first content token,
last byte) and reads the `x-llmfleet-cache` header; and the CPU time of a few processes in nanoseconds
(the kernel's per-thread run time in `/proc/<pid>/task/<tid>/schedstat`), fine enough for one request's
window, where psutil's user+system counts whole 10 ms clock ticks.

A bare asyncio protocol (uvloop), as in `tools.bench.wire`, so the client's own cost is small and the
same for every arm.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import psutil

from tools.bench.common import tree, tree_cpu_seconds
from tools.bench.wire import CHUNKED_END

CACHE_HEADER = b"x-llmfleet-cache"
_CONTENT = re.compile(rb'"content":\s*"[^"]')  # a content token (the role chunk's content is "")
_CONTENT_LENGTH = re.compile(rb"content-length:\s*(\d+)")


@dataclass(frozen=True)
class Answer:
    """One request's response as the client saw it; times in seconds from the request's write."""

    status: int
    cache: str  # the x-llmfleet-cache header ("" when absent: the cache was not asked)
    first_byte_s: float
    first_token_s: float | None
    total_s: float


class Connection(asyncio.Protocol):
    """One keep-alive connection, one request at a time (no pipelining)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.lost = asyncio.get_running_loop().create_future()
        self._buf = bytearray()
        self._done: asyncio.Future[Answer] | None = None
        self._t0 = self._first_byte = 0.0
        self._first_token: float | None = None
        self._status = 0
        self._cache = ""
        self._body_at = -1
        self._length: int | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it

    def request(self, raw: bytes) -> asyncio.Future[Answer]:
        assert self.transport is not None
        self._buf.clear()
        self._first_token, self._status, self._cache, self._body_at, self._length = None, 0, "", -1, None
        self._done = asyncio.get_running_loop().create_future()
        self._t0 = time.perf_counter()
        self.transport.write(raw)
        return self._done

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if not self._buf:
            self._first_byte = now - self._t0
        start = max(len(self._buf) - 16, self._body_at, 0)
        self._buf += data
        if self._body_at < 0 and not self._head():
            return
        if self._first_token is None and self._status == 200 and _CONTENT.search(self._buf, start):
            self._first_token = now - self._t0
        body = len(self._buf) - self._body_at
        complete = body >= self._length if self._length is not None else self._buf.endswith(CHUNKED_END)
        if complete and self._done is not None and not self._done.done():
            answer = Answer(self._status, self._cache, self._first_byte, self._first_token, now - self._t0)
            self._done.set_result(answer)

    def _head(self) -> bool:
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            return False
        head = bytes(self._buf[:end]).lower()
        self._status = int(head[9:12])
        self._body_at = end + 4
        m = _CONTENT_LENGTH.search(head)
        self._length = int(m.group(1)) if m else None
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name == CACHE_HEADER:
                self._cache = value.strip().decode()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_exception(ConnectionError("connection lost"))
        if not self.lost.done():
            self.lost.set_result(None)


class Client:
    """A team's connection to the gateway (re-opened, outside the timed request, if the server closed it)."""

    def __init__(self, port: int, key: str) -> None:
        self.port, self.key = port, key
        self._conn: Connection | None = None

    async def ready(self) -> None:
        if self._conn is None or self._conn.lost.done():
            loop = asyncio.get_running_loop()
            _, self._conn = await loop.create_connection(Connection, "127.0.0.1", self.port)

    def raw(self, body: dict[str, Any]) -> bytes:
        data = json.dumps(body, separators=(",", ":")).encode()
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            f"Authorization: Bearer {self.key}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        ).encode()
        return head + data

    async def send(self, raw: bytes, timeout_s: float = 60.0) -> Answer:
        """One request on the ready connection (call `ready` first, outside the timed window)."""
        assert self._conn is not None
        async with asyncio.timeout(timeout_s):
            return await self._conn.request(raw)

    def close(self) -> None:
        if self._conn is not None and self._conn.transport is not None:
            self._conn.transport.close()


class CpuClock:
    """CPU seconds of some processes and their descendants, from the kernel's per-thread run time
    (nanoseconds) where it is readable, else psutil's user+system (10 ms ticks). `precise` says which."""

    def __init__(self, procs: Sequence[psutil.Process]) -> None:
        self._procs = list(procs)
        self._pids = [p.pid for p in tree(self._procs)]
        self.precise = all(Path(f"/proc/{pid}/schedstat").exists() for pid in self._pids) and bool(self._pids)

    def seconds(self) -> float:
        if not self.precise:
            return tree_cpu_seconds(self._procs)
        total = 0
        for pid in self._pids:
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except FileNotFoundError:
                continue
            for tid in tids:
                try:
                    with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as fh:
                        total += int(fh.read().split()[0])
                except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                    continue  # a thread that ended meanwhile
        return total / 1e9
