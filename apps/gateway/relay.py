"""Relaying one upstream SSE stream to one client, bound to the client connection.

`RelayResponse` is an ASGI response that runs two tasks in one TaskGroup: the relay
(upstream bytes -> client, unchanged: docs/architecture.md D5) and a watcher for
`http.disconnect`. Whichever ends first cancels the other. Per-phase deadlines: the first
chunk within `first_token_s`, then at most `idle_s` between chunks, and the whole stream within
`max_request_s` (so it never outlives its stream slot's lease); a timeout or an
upstream that ends without `[DONE]` gives the client one error event and `[DONE]`, never a
silent truncation. The cleanup (close upstream so the orchestrator cancels and settles,
release the stream slot) runs in `finally`, shielded and bounded, and cancellation is
re-raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from apps.core.aio import shielded
from apps.core.error_table import TIMEOUT, UPSTREAM_ERROR, WireError, stream_error
from apps.core.protocol.openai import SSE_DONE, SseSplitter, is_usage_event, parse_usage
from apps.gateway.ports import Upstream
from apps.netio.uvicorn_writer import DirectWriter, direct_writer

# The usage event (the orchestrator writes it with `[DONE]`) must lie within the stream's last
# reads; a window of reads, not bytes, keeps the per-chunk cost at one deque append. Missing it
# only loses the gateway's output-token metric: billing comes from the orchestrator's settle.
USAGE_WINDOW_READS = 8
_DONE_LEN = len(SSE_DONE)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class RelayOutcome:
    def __init__(self) -> None:
        self.first_byte_at: float | None = None
        self.completion_tokens: int | None = None
        self.prompt_tokens: int | None = None
        self.direct_chunks = 0  # written by the upstream's sink (apps.netio.uvicorn_writer)
        self.asgi_chunks = 0  # written through ASGI `send`
        self.ended: str = "running"  # done | upstream_error | timeout | disconnect


class RelayResponse:
    def __init__(
        self,
        upstream: Upstream,
        *,
        headers: dict[str, str],
        first_token_s: float,
        idle_s: float,
        watch_usage: bool,
        cleanup: Callable[[RelayOutcome], Awaitable[None]],
        cleanup_timeout_s: float,
        max_request_s: float | None = None,
        fast_paths: str,
    ) -> None:
        self._upstream = upstream
        self._fast_paths = fast_paths  # the `netio_fastpaths` setting
        self._max_request_s = max_request_s
        self._headers = headers
        self._first_token_s = first_token_s
        self._idle_s = idle_s
        self._watch_usage = watch_usage
        self._cleanup = cleanup
        self._cleanup_timeout_s = cleanup_timeout_s
        self.outcome = RelayOutcome()
        self._last = 0.0
        self._now = time.monotonic
        self._tail = b""
        self._recent: deque[bytes] | None = None
        self._direct: DirectWriter | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
        headers += [(k.lower().encode(), v.encode()) for k, v in self._headers.items()]
        self._direct = direct_writer(scope, switch=self._fast_paths)
        self._now = asyncio.get_running_loop().time
        self._last = self._now()
        self._started = self._last
        self._recent = deque(maxlen=USAGE_WINDOW_READS) if self._watch_usage else None
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await self._write_buffered(send)
            async with asyncio.TaskGroup() as tg:
                relay = tg.create_task(self._relay(send))
                watcher = tg.create_task(self._watch(receive, relay))
                watchdog = tg.create_task(self._deadlines(relay))
                relay.add_done_callback(lambda _t: (watcher.cancel(), watchdog.cancel()))
            if self.outcome.ended == "timeout":
                if self._over_max_time():
                    await self._fail(
                        send, f"maximum request time ({self._max_request_s:g} s) exceeded", TIMEOUT
                    )
                else:
                    phase = "first token" if self.outcome.first_byte_at is None else "idle"
                    await self._fail(send, f"upstream {phase} timeout", TIMEOUT)
        except OSError:
            self.outcome.ended = "disconnect"
        finally:
            await shielded(self._cleanup(self.outcome), self._cleanup_timeout_s, "relay_cleanup")

    async def _write_buffered(self, send: Send) -> None:
        """The first chunk usually arrived with the upstream's response head: write it now, in the
        task that the head woke, instead of one more event-loop turn later in the relay task (a turn
        that, at 200 streams, can hold a whole engine step's wave of other streams' chunks)."""
        take = getattr(self._upstream, "take_buffered", None)
        data = take() if take is not None else b""
        if not data or self._through(data):
            return
        self._note(data)
        self.outcome.asgi_chunks += 1
        await send({"type": "http.response.body", "body": data, "more_body": True})

    async def _watch(self, receive: Receive, relay: asyncio.Task[None]) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                # A server reports "disconnect" as soon as the last body part is out: that is the end
                # of a finished response, not a client that left.
                if self.outcome.ended == "running":
                    self.outcome.ended = "disconnect"
                    relay.cancel()
                return

    async def _deadlines(self, relay: asyncio.Task[None]) -> None:
        """One timer per stream instead of one per chunk: the relay only stamps `_last`."""
        loop = asyncio.get_running_loop()
        while True:
            limit = self._first_token_s if self.outcome.first_byte_at is None else self._idle_s
            remaining = self._last + limit - loop.time()
            if self._max_request_s is not None:
                remaining = min(remaining, self._started + self._max_request_s - loop.time())
            if remaining <= 0:
                self.outcome.ended = "timeout"
                relay.cancel()
                return
            await asyncio.sleep(remaining)

    async def _relay(self, send: Send) -> None:
        # The per-chunk path is the gateway's hottest loop (10,000 chunks/s at 200 streams). While
        # this coroutine waits for upstream and the client keeps up, the upstream connection hands
        # each chunk to `_through`, which writes it to the client socket from `data_received` (no
        # task wake-up, no ASGI `send`; see `apps.netio.uvicorn_writer`); whatever it declines is buffered and
        # comes out of this loop through `send`, in order. `[DONE]` and the usage event are only
        # looked for once the stream ended, in references to the last few reads.
        outcome = self.outcome
        set_sink = getattr(self._upstream, "set_sink", None) if self._direct is not None else None
        if set_sink is not None:
            set_sink(self._through)
        try:
            async for data in self._upstream.chunks():
                self._note(data)
                outcome.asgi_chunks += 1
                await send({"type": "http.response.body", "body": data, "more_body": True})
        except (OSError, ValueError):
            # The upstream connection broke mid-stream (the HTTP dispatcher maps client errors to OSError).
            outcome.ended = "upstream_error"
            await self._fail(send, "upstream connection lost")
            return
        finally:
            if set_sink is not None:
                set_sink(None)
        if self._tail[-_DONE_LEN:] != SSE_DONE:
            outcome.ended = "upstream_error"
            await self._fail(send, "upstream ended without [DONE]")
            return
        if self._recent:
            self._scan_usage(b"".join(self._recent))
        outcome.ended = "done"
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _over_max_time(self) -> bool:
        return self._max_request_s is not None and self._now() >= self._started + self._max_request_s

    def _note(self, data: bytes) -> None:
        """Per-chunk bookkeeping: the idle deadline's stamp, TTFT, the `[DONE]` tail, the usage window."""
        self._last = self._now()
        if self.outcome.first_byte_at is None:
            self.outcome.first_byte_at = time.monotonic()
        # Only reads shorter than the marker need joining: a tail split over tiny reads.
        self._tail = data if len(data) >= _DONE_LEN else (self._tail + data)[-_DONE_LEN:]
        if self._recent is not None:
            self._recent.append(data)

    def _through(self, data: bytes) -> bool:
        """The upstream's sink (called from its `data_received`): True when written to the client."""
        direct = self._direct
        if direct is None or not direct.write(data):
            return False
        self._note(data)
        self.outcome.direct_chunks += 1
        return True

    def _scan_usage(self, end_of_stream: bytes) -> None:
        """The usage event is the last event before `[DONE]`; the window may start mid-event,
        which the splitter drops (a fragment does not start with `data:`)."""
        with contextlib.suppress(ValueError):
            for payload in reversed(SseSplitter().feed(end_of_stream)):
                if is_usage_event(payload):
                    self._note_usage(payload)
                    return

    def _note_usage(self, payload: bytes) -> None:
        usage = parse_usage(payload)
        if usage is not None:
            self.outcome.prompt_tokens = usage.prompt_tokens
            self.outcome.completion_tokens = usage.completion_tokens

    async def _fail(self, send: Send, message: str, entry: WireError = UPSTREAM_ERROR) -> None:
        body = stream_error(entry, message)
        await send({"type": "http.response.body", "body": body, "more_body": False})
