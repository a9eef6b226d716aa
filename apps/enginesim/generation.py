"""A planned request through the engine, whatever endpoint planned it (chat, legacy completions,
embeddings): the seam the routes share so that admission, scheduling, the KV cache, prefix caching
and the metrics are one machinery.

- `submit()`: one scheduler sequence per choice of a `ChatJob` (a `CompletionJob` too: each choice
  continues its own prompt, `job.prompt_of(choice)`), all feeding one `OutputStream`.
- `collect()`: wait until every choice finished (a non-streamed answer).
- `stream()`: write every token as the endpoint's chunk (`StreamFormat`), with the injected faults
  (`faults.py`) and the `--timing-log` line, then the tail (usage) and `data: [DONE]`.
- `prefill()`: a pooling request (an embedding): prompt-only sequences, done when their prefill is.
- `stream_error()`: a stream the engine refused once it had started (vLLM's input checks): 200,
  the error event, `[DONE]`.

Whatever ends a handler (done, client disconnect, injected death) aborts the sequences still in the
engine, so their KV blocks are freed at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Iterable
from typing import Protocol

from aiohttp import web

from apps.core.batching.prefix_cache import block_hashes
from apps.enginesim import responses, textgen
from apps.enginesim.chat import ChatJob, Choice
from apps.enginesim.engine import OutputStream
from apps.enginesim.errors import VllmError
from apps.enginesim.faults import Faults
from apps.enginesim.prompts import Prompt
from apps.enginesim.state import SSE_HEADERS, SimState

DONE = b"data: [DONE]\n\n"
_DROP, _END = "drop", "end"  # how an injected fault ends a stream


class StreamFormat(Protocol):
    """How one endpoint writes its stream (`responses.ChatFormat`, `completion_bodies.CompletionFormat`)."""

    def opening(self, choice: Choice) -> bytes:
        """What goes out right before a choice's first token (chat: its role chunk)."""
        ...

    def token(self, choice: Choice, token_index: int, last: bool, final_of_stream: bool) -> bytes:
        """The chunk of one token (`last`: the choice's final one; `final_of_stream`: the last
        chunk of the stream, no usage chunk following)."""
        ...

    def tail(self) -> bytes:
        """What goes out after every choice finished, before `[DONE]` (the usage chunk, if asked)."""
        ...


def submit(state: SimState, job: ChatJob) -> tuple[OutputStream, dict[str, Choice]]:
    sink = OutputStream(job.request_id)
    by_seq: dict[str, Choice] = {}
    job.prompt_details = state.prompt_details
    for choice in job.choices:
        seq_id = f"{job.request_id}-{choice.index}"
        by_seq[seq_id] = choice
        prompt_tokens, prompt_ids = job.prompt_of(choice)
        # vLLM caches full blocks of generated tokens too: the choice's planned answer is hashed
        # with its prompt (a block is cached only once its tokens are computed).
        ids: tuple[int, ...] = ()
        hashes: tuple[int, ...] = ()
        if state.prefix_caching:
            ids = prompt_ids + tuple(textgen.answer_token_ids(choice.words))
            hashes = block_hashes(ids, state.profile.block_size, job.cache_salt)
        state.engine.submit(
            seq_id,
            prompt_tokens,
            choice.target_tokens,
            choice.finish_reason,
            sink=sink,
            priority=job.priority,
            block_hashes=hashes,
            token_ids=ids,
            cache_salt=job.cache_salt,
        )
    return sink, by_seq


def _note_cache(job: ChatJob, sink: OutputStream) -> None:
    """The request's prefix-cache numbers, for its usage (known once it was first scheduled)."""
    job.cached_tokens = sink.cached_tokens or 0
    job.created_cache_tokens = sink.created_cache_tokens or 0


def abort_all(state: SimState, seq_ids: Iterable[str]) -> None:
    for seq_id in seq_ids:
        state.engine.abort(seq_id)


async def collect(state: SimState, job: ChatJob) -> None:
    """Run every choice to its end (the job then holds its prefix-cache numbers)."""
    sink, by_seq = submit(state, job)
    remaining = len(by_seq)
    try:
        while remaining:
            for token in await sink.next_tokens():
                if token.finish_reason is not None:
                    remaining -= 1
    finally:
        abort_all(state, by_seq)
    _note_cache(job, sink)


async def prefill(state: SimState, request_id: str, prompts: list[Prompt], priority: int) -> None:
    """Run one prompt-only sequence per prompt until each one's prefill is done: what a pooling
    model computes for an embedding (its full prompt blocks are prefix-cached, as vLLM's)."""
    sink = OutputStream(request_id)
    seq_ids = [f"{request_id}-{i}" for i in range(len(prompts))]
    for seq_id, prompt in zip(seq_ids, prompts, strict=True):
        ids: tuple[int, ...] = prompt.ids if state.prefix_caching else ()
        hashes = block_hashes(ids, state.profile.block_size, None) if ids else ()
        state.engine.submit(
            seq_id,
            prompt.tokens,
            1,
            "stop",
            sink=sink,
            priority=priority,
            block_hashes=hashes,
            token_ids=ids,
            pooling=True,
        )
    remaining = len(seq_ids)
    try:
        while remaining:
            remaining -= sum(1 for t in await sink.next_tokens() if t.finish_reason is not None)
    finally:
        abort_all(state, seq_ids)


async def stream_error(request: web.Request, exc: VllmError) -> web.StreamResponse:
    """A stream whose request the engine refused once it was already answering 200 (vLLM's input
    processor runs then): the error event, then `[DONE]`."""
    resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
    await resp.prepare(request)
    await resp.write(responses.error_event(exc.message, exc.type, exc.status) + DONE)
    await resp.write_eof()
    return resp


async def stream(
    request: web.Request, state: SimState, job: ChatJob, fmt: StreamFormat, faults: Faults, arrived: float
) -> web.StreamResponse:
    resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
    sink, by_seq = submit(state, job)
    timing = state.timing
    first_content: float | None = None
    if timing is not None:
        timing.open_streams += 1
    try:
        await resp.prepare(request)
        if faults.die_after_tokens == 0:
            _drop_connection(request)
            return resp
        if faults.error_after_tokens == 0:
            await resp.write(responses.error_event(faults.fail_message) + DONE)
            return resp
        async with contextlib.aclosing(_chunks(sink, by_seq, job, fmt, faults)) as chunks:
            async for out in chunks:
                if isinstance(out, str):  # an injected fault ended the stream
                    if out == _DROP:
                        _drop_connection(request)
                    return resp
                await resp.write(out)
                if timing is not None and first_content is None:
                    first_content = time.monotonic()  # the first token's chunk (and opening) went out
        _note_cache(job, sink)
        await resp.write(fmt.tail() + DONE)
        await resp.write_eof()
    except ConnectionResetError:
        pass  # the client went away; the finally block aborts the sequences
    finally:
        abort_all(state, by_seq)
        if timing is not None:
            if first_content is not None:
                timing.record(job.user, arrived, first_content)
            timing.stream_ended()
    return resp


async def _chunks(
    sink: OutputStream, by_seq: dict[str, Choice], job: ChatJob, fmt: StreamFormat, faults: Faults
) -> AsyncGenerator[bytes | str, None]:
    """The stream's writes, one chunk each (with its choice's opening before its first token);
    an injected fault ends them with `_DROP` (drop the connection) or an error event and `_END`."""
    remaining = len(by_seq)
    sent = 0
    stalled = False
    while remaining:
        for token in await sink.next_tokens():
            choice = by_seq[token.request_id]
            last = token.finish_reason is not None
            if last:
                remaining -= 1
            out = fmt.opening(choice) if token.index == 0 else b""
            final_of_stream = last and remaining == 0 and not job.include_usage
            out += fmt.token(choice, token.index, last, final_of_stream)
            if faults.stall_s is not None and not stalled and sent >= faults.stall_after_tokens:
                stalled = True
                await asyncio.sleep(faults.stall_s)
            yield out
            sent += 1
            if faults.die_after_tokens is not None and sent >= faults.die_after_tokens:
                yield _DROP
                return
            if faults.error_after_tokens is not None and sent >= faults.error_after_tokens:
                yield responses.error_event(faults.fail_message) + DONE
                yield _END
                return


def _drop_connection(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()
