"""Running one `assign` against the engine: stream, forward, and report usage.

Owns the life of one request on this node:

* The engine's body is built here, once, from the assignment (`engine_body`,
  `apps/core/protocol/engine.py`): streaming, usage on every chunk (the running usage,
  `tally.py`; cut out of the forwarded bytes unless the client asked for it itself), the
  budget's `max_tokens` and `n`, the priority, a resumed stream's continuation.
* SSE events are forwarded as `chunk` frames, each the engine's `data: ...\\n\\n` bytes
  as text. Events that arrive in one socket read are coalesced into one frame (no timer,
  so coalescing adds no latency). The usage chunk and `[DONE]` are not forwarded; the
  usage goes into `done` (and its raw payload into `done.usage_event`).
* Outcomes: `done` with the engine's usage; `done` with `finish_reason: "abort"` after a
  cancel; `error` with `chunks_sent: 0` (nothing forwarded: a retry elsewhere is safe)
  or `chunks_sent > 0` with the usage so far.

After an abort or a mid-stream failure the engine sends no final usage chunk: the usage
billed is the running usage of the last chunk the node saw (per choice, summed), the
engine's own count (docs/architecture.md D5; docs/agent.md). Only an engine that sends no per-chunk usage makes
the agent count content chunks and ask `POST /tokenize` for the prompt. An abort before the
first chunk bills nothing: the engine had not finished prefill.

Phases have deadlines: response headers and first event within
`first_byte_timeout_s`, then at most `idle_timeout_s` (plus a slack of at most 1 s, so the
deadline is not re-armed on every token) between two reads. One
`asyncio.timeout` scope carries both the deadlines and the abort: `abort()` reschedules
it to now, so a cancel interrupts any await without swallowing a real cancellation.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from dataclasses import dataclass
from typing import Protocol

from apps.agent import errors
from apps.agent.engine import EngineClient
from apps.agent.tally import TokenTally
from apps.core.error_table import (
    INVALID_REQUEST,
    NODE_DRAINING,
    SERVICE_UNAVAILABLE,
    TIMEOUT,
    UPSTREAM_ERROR,
    WireError,
)
from apps.core.protocol.engine import ENGINE_PATHS, engine_body, wants_chunk_usage
from apps.core.protocol.node import Assign, Chunk, Done, Error
from apps.core.protocol.openai import (
    DONE_PAYLOAD,
    SseSplitter,
    cached_tokens,
    is_error_event,
    is_usage_event,
    one_line_answer,
    parse_usage,
    sse_event,
)
from apps.netio.http_client import HttpResponse, Unreachable

log = logging.getLogger("llmfleet.agent.relay")

_ROLE_MARK = b'"delta":{"role"'
_FINISH_MARK = b'"finish_reason":"'
_MAX_ERROR_BODY = 64 * 1024
# An embedding answer's bound: it travels as one frame, and the orchestrator takes messages of
# at most 8 MiB (`apps/orchestrator/node_ws.py`); the gateway's input cap keeps answers under it.
MAX_ANSWER_BYTES = 7 * 1024 * 1024


async def _read_bounded(resp: HttpResponse, limit: int) -> bytes:
    """At most about `limit` bytes of a (short) error body; the rest is not read."""
    parts: list[bytes] = []
    size = 0
    async for data in resp:
        parts.append(data)
        size += len(data)
        if size >= limit:
            break
    return b"".join(parts)[:limit]


class ChunkSink(Protocol):
    async def send_chunk(self, frame: Chunk, *, first: bool = False) -> None:
        """Queue a chunk frame for the orchestrator (may wait: the send queue is bounded);
        `first`: the request's first chunk (sent ahead of other requests' queued chunks)."""
        ...


class Outcome(enum.Enum):
    COMPLETED = "completed"  # done with the engine's usage
    ABORTED = "aborted"  # done with finish_reason abort (cancel, connection lost, drain deadline)
    FAILED = "failed"  # error frame


@dataclass(frozen=True)
class RelayTimeouts:
    connect_s: float = 5.0
    first_byte_s: float = 600.0
    idle_s: float = 60.0


def _finish_reason(payload: bytes) -> str | None:
    at = payload.find(_FINISH_MARK)
    if at < 0:
        return None
    start = at + len(_FINISH_MARK)
    end = payload.find(b'"', start)
    return payload[start:end].decode() if end > start else None


class Relay:
    def __init__(
        self, assign: Assign, engine: EngineClient, sink: ChunkSink, timeouts: RelayTimeouts
    ) -> None:
        self.assign = assign
        self._engine = engine
        self._sink = sink
        self._timeouts = timeouts
        self._body = engine_body(assign)  # the one place the engine's body is built
        self._scope: asyncio.Timeout | None = None
        self._abort_reason: str | None = None
        self._handoff = False
        self._deadline_phase = "response headers"
        # What has happened so far, for partial usage.
        self.events_sent = 0  # SSE events forwarded (role chunk included)
        self.tokens = 0  # content chunks (the first-token logic; billing only without a tally)
        n = self._body.get("n")
        self.tally = TokenTally(wants_chunk_usage(assign), n if isinstance(n, int) and n > 1 else 1)
        self.finish_reason: str | None = None
        self.outcome: Outcome | None = None

    @property
    def request_id(self) -> str:
        return self.assign.request_id

    @property
    def completion_tokens(self) -> int:
        """Completion tokens so far: the engine's running count, else the content chunks seen."""
        return self.tally.completion_tokens if self.tally.seen else self.tokens

    def abort(self, reason: str, *, handoff: bool = False) -> None:
        """Stop the request: close the upstream connection (vLLM aborts on disconnect).
        `handoff` (a drain whose deadline passed): a request that already sent output ends with
        an `error` of type `node_draining` (503) instead of `done(abort)`, so the orchestrator
        resumes it on another node (docs/control-plane.md, "Resume")."""
        if self._abort_reason is not None:
            return
        self._abort_reason = reason
        self._handoff = handoff
        scope = self._scope
        if scope is not None and not scope.expired():
            scope.reschedule(asyncio.get_running_loop().time())

    async def run(self) -> Done | Error:
        frame = await self._run()
        if isinstance(frame, Error):
            self.outcome = Outcome.FAILED
        elif frame.finish_reason == "abort" and self._abort_reason is not None:
            self.outcome = Outcome.ABORTED
        else:
            self.outcome = Outcome.COMPLETED
        return frame

    async def _run(self) -> Done | Error:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout_at(loop.time() + self._timeouts.first_byte_s) as scope:
                self._scope = scope
                if self._abort_reason is not None:
                    scope.reschedule(loop.time())
                return await self._stream(scope)
        except TimeoutError:
            if self._abort_reason is not None and self._handoff and self.events_sent > 0:
                return await self._failed(NODE_DRAINING, "the node drained before the answer finished")
            if self._abort_reason is not None:
                return await self._aborted()
            return await self._failed(TIMEOUT, f"engine timed out waiting for {self._deadline_phase}")
        except Unreachable:
            return await self._failed(SERVICE_UNAVAILABLE, "engine unreachable")
        except (ConnectionError, ValueError) as exc:
            # ConnectionError: the engine died mid-response (or dropped the connection before
            # answering); ValueError: an SSE event over the size bound, or a malformed response.
            log.warning(
                "engine stream broke", extra={"request_id": self.request_id, "error": type(exc).__name__}
            )
            return await self._failed(UPSTREAM_ERROR, "engine closed the stream")
        finally:
            self._scope = None

    async def _stream(self, scope: asyncio.Timeout) -> Done | Error:
        loop = asyncio.get_running_loop()
        resp = await self._engine.open(ENGINE_PATHS[self.assign.endpoint], self._body)
        try:
            if resp.status != 200:
                raw = await _read_bounded(resp, _MAX_ERROR_BODY)
                err = errors.from_http(resp.status, raw)
                return await self._failed(err.entry, err.message, err.param)
            if self.assign.endpoint == "embeddings":
                self._deadline_phase = "the embeddings"
                return await self._read_answer(resp)
            self._deadline_phase = "the first token"
            return await self._read_events(resp, scope, loop)
        finally:
            # A stream read to its end goes back to the pool (this is then a no-op); a half-read
            # one is dropped: closing the socket is what makes vLLM abort the request.
            await resp.aclose()

    async def _read_events(
        self, resp: HttpResponse, scope: asyncio.Timeout, loop: asyncio.AbstractEventLoop
    ) -> Done | Error:
        splitter = SseSplitter()
        usage_raw: bytes | None = None
        saw_done = False
        while data := await resp.readany():
            self._note_output(scope, loop)
            urgent = self.tokens == 0
            out: list[bytes] = []
            for payload in splitter.feed(data):
                if payload == DONE_PAYLOAD:
                    saw_done = True
                elif is_usage_event(payload):
                    usage_raw = payload
                elif is_error_event(payload):
                    if out:
                        await self._forward(out, urgent)
                    err = errors.from_stream_event(payload)
                    return await self._failed(err.entry, err.message, err.param)
                else:
                    out.append(sse_event(self.tally.take(payload)))
                    if _ROLE_MARK not in payload:
                        self.tokens += 1
                    reason = _finish_reason(payload)
                    if reason is not None:
                        self.finish_reason = reason
            if out:
                await self._forward(out, urgent)
            if saw_done:
                # The end of the body (the last chunk of the chunked encoding) follows `[DONE]` at
                # once: read it, so the connection goes back to the pool instead of being closed
                # (a new connection per request costs the engine and the agent).
                while await resp.readany():
                    pass
                break
        if usage_raw is not None:
            usage = parse_usage(usage_raw)
            if usage is not None:
                return Done(
                    request_id=self.request_id,
                    prompt_tokens=usage.prompt_tokens,
                    completion_tokens=usage.completion_tokens,
                    finish_reason=self.finish_reason,
                    usage_event=usage_raw.decode(),
                    cached_tokens=cached_tokens(usage_raw),
                )
        if saw_done:
            # The engine ignored include_usage: bill what we can count (logged, should not happen).
            log.warning("engine stream had no usage chunk", extra={"request_id": self.request_id})
            return Done(
                request_id=self.request_id,
                prompt_tokens=await self._prompt_tokens(),
                completion_tokens=self.completion_tokens,
                finish_reason=self.finish_reason,
            )
        return await self._failed(UPSTREAM_ERROR, "engine closed the stream before it finished")

    async def _read_answer(self, resp: HttpResponse) -> Done | Error:
        """An embedding request's one JSON answer (within the first-byte deadline): forwarded as one
        chunk whose single event is the engine's body, byte for byte, then `done` with its
        `usage.prompt_tokens` (nothing is generated). An answer over `MAX_ANSWER_BYTES` (the
        gateway's input cap keeps a real one under it) or without usage fails the request."""
        raw = await _read_bounded(resp, MAX_ANSWER_BYTES + 1)
        if len(raw) > MAX_ANSWER_BYTES:
            return await self._failed(
                INVALID_REQUEST, f"the embeddings answer is over {MAX_ANSWER_BYTES} bytes: send fewer inputs"
            )
        answer = one_line_answer(raw)
        if answer is None:
            return await self._failed(UPSTREAM_ERROR, "the engine's embeddings answer has no usage")
        event, prompt_tokens = answer
        await self._forward([sse_event(event)], True)
        return Done(request_id=self.request_id, prompt_tokens=prompt_tokens, completion_tokens=0)

    def _note_output(self, scope: asyncio.Timeout, loop: asyncio.AbstractEventLoop) -> None:
        if self._abort_reason is not None:
            return
        self._deadline_phase = "the next token"
        # Move the deadline only when it left [now + idle_s, now + idle_s + slack] (closer: time
        # passed; further: still the first-byte deadline): one reschedule (a cancelled timer plus
        # a new one on the loop's heap) per `slack` seconds instead of one per token.
        idle_s = self._timeouts.idle_s
        slack = min(1.0, idle_s / 20)
        now = loop.time()
        when = scope.when()
        if when is None or not now + idle_s <= when <= now + idle_s + slack:
            scope.reschedule(now + idle_s + slack)

    async def _forward(self, events: list[bytes], urgent: bool) -> None:
        """`urgent`: the frame carries no token or the first one (it leads the batch of queued frames
        it is sent in; later frames of this request queue behind it)."""
        self.events_sent += len(events)
        frame = Chunk(request_id=self.request_id, delta=b"".join(events).decode())
        await self._sink.send_chunk(frame, first=urgent)

    async def _prompt_tokens(self) -> int:
        if self.events_sent == 0:
            return 0  # no first token: prefill never finished, nothing billable
        if self.tally.prompt_tokens is not None:
            return self.tally.prompt_tokens  # the engine's own count, on every chunk
        count = await self._engine.prompt_tokens(self._body)
        if count is None:
            log.warning(
                "prompt tokens unknown: engine /tokenize failed", extra={"request_id": self.request_id}
            )
            return 0
        return count

    async def _aborted(self) -> Done:
        return Done(
            request_id=self.request_id,
            prompt_tokens=await self._prompt_tokens(),
            completion_tokens=self.completion_tokens,
            finish_reason="abort",
        )

    async def _failed(self, entry: WireError, message: str, param: str | None = None) -> Error:
        """The `error` frame of `entry` (apps/core/error_table.py)."""
        return Error(
            request_id=self.request_id,
            status=entry.status,
            message=message,
            error_type=entry.frame_type,
            param=param,
            chunks_sent=self.events_sent,
            prompt_tokens=await self._prompt_tokens(),
            completion_tokens=self.completion_tokens,
        )
