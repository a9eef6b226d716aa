"""HTTP routes of the simulator: vLLM's OpenAI-compatible surface plus `/_sim/faults`.

Every chat request becomes one scheduler sequence per choice; all of them feed one
`OutputStream`. Whatever ends the handler (done, client disconnect, injected death) aborts the
sequences that are still in the engine, so their KV blocks are freed at once.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import IO, Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from apps.core.batching.prefix_cache import block_hashes
from apps.enginesim import chat, responses, textgen
from apps.enginesim.engine import Engine, OutputStream
from apps.enginesim.faults import FaultBox, Faults
from apps.enginesim.metrics import EngineMetrics
from apps.enginesim.profiles import EngineProfile


def _compact(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def json_response(body: Any, status: int = 200) -> web.Response:
    """vLLM answers compact JSON (Starlette's JSONResponse)."""
    return web.json_response(body, status=status, dumps=_compact)


SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


@dataclass
class TimingLog:
    """Per streamed request: when it arrived and when its first content chunk was written
    (`time.monotonic()`, so a client on the same machine can subtract the engine's own TTFT from
    its own and keep only the time spent in transit). One JSON line per request, appended.

    Lines wait in memory and go out in one write once no timed stream is open any more (the end of
    a load run) or `batch` of them are pending, so the log costs no syscall per request while a
    run is going. Only the `user` tag and two clocks are written: never prompt or completion text.
    """

    path: str
    batch: int = 256
    open_streams: int = 0
    _pending: list[str] = field(default_factory=list)
    _file: IO[str] | None = None

    def record(self, user: str | None, arrived: float, first_content: float) -> None:
        line = {"user": user, "arrived": arrived, "first_content": first_content}
        self._pending.append(json.dumps(line, separators=(",", ":")) + "\n")

    def stream_ended(self) -> None:
        self.open_streams -= 1
        if self.open_streams == 0 or len(self._pending) >= self.batch:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open, closed in close()
        self._file.write("".join(self._pending))
        self._file.flush()
        self._pending.clear()

    def close(self) -> None:
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None


@dataclass
class SimState:
    served_model: str
    profile: EngineProfile
    engine: Engine
    metrics: EngineMetrics
    faults: FaultBox
    seed: int
    timing: TimingLog | None = None  # `--timing-log`: None costs nothing per request
    prefix_caching: bool = True  # vLLM's `--enable-prefix-caching` (its default)
    prompt_details: bool = False  # `--enable-prompt-tokens-details`


STATE_KEY = web.AppKey("enginesim_state", SimState)


def _error(exc: chat.VllmError) -> web.Response:
    return json_response(exc.body(), status=exc.status)


def _submit(state: SimState, job: chat.ChatJob) -> tuple[OutputStream, dict[str, chat.Choice]]:
    sink = OutputStream(job.request_id)
    by_seq: dict[str, chat.Choice] = {}
    job.prompt_details = state.prompt_details
    for choice in job.choices:
        seq_id = f"{job.request_id}-{choice.index}"
        by_seq[seq_id] = choice
        # vLLM caches full blocks of generated tokens too: the choice's planned answer is hashed
        # with its prompt (a block is cached only once its tokens are computed).
        ids: tuple[int, ...] = ()
        hashes: tuple[int, ...] = ()
        if state.prefix_caching:
            ids = job.prompt_token_ids + tuple(textgen.answer_token_ids(choice.words))
            hashes = block_hashes(ids, state.profile.block_size, job.cache_salt)
        state.engine.submit(
            seq_id,
            job.prompt_tokens,
            choice.target_tokens,
            choice.finish_reason,
            sink=sink,
            priority=job.priority,
            block_hashes=hashes,
            token_ids=ids,
            cache_salt=job.cache_salt,
        )
    return sink, by_seq


def _note_cache(job: chat.ChatJob, sink: OutputStream) -> None:
    """The request's prefix-cache numbers, for its usage (known once it was first scheduled)."""
    job.cached_tokens = sink.cached_tokens or 0
    job.created_cache_tokens = sink.created_cache_tokens or 0


def _abort_all(state: SimState, by_seq: dict[str, chat.Choice]) -> None:
    for seq_id in by_seq:
        state.engine.abort(seq_id)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    arrived = time.monotonic() if state.timing is not None else 0.0  # before the body is read
    faults = state.faults.take()
    if faults.fail_status is not None:
        return _error(chat.VllmError(faults.fail_status, _type_for(faults.fail_status), faults.fail_message))
    try:
        body = chat.parse_body(await request.read())
        job = chat.plan_chat(
            body,
            served_model=state.served_model,
            max_model_len=state.profile.max_model_len,
            mean_answer_tokens=state.profile.mean_answer_tokens,
            server_seed=state.seed,
            priority_scheduling=state.engine.scheduler.by_priority,
        )
    except chat.VllmError as exc:
        return _error(exc)
    if job.stream:
        return await _stream(request, state, job, faults, arrived)
    return await _complete(state, job)  # no first content chunk, so nothing for the timing log


def _type_for(status: int) -> str:
    return {
        400: "BadRequestError",
        401: "AuthenticationError",
        404: "NotFoundError",
        429: "RateLimitError",
        500: "InternalServerError",
        501: "NotImplementedError",
        503: "ServiceUnavailableError",
    }.get(status, "InternalServerError")


async def _complete(state: SimState, job: chat.ChatJob) -> web.Response:
    sink, by_seq = _submit(state, job)
    remaining = len(by_seq)
    try:
        while remaining:
            for token in await sink.next_tokens():
                if token.finish_reason is not None:
                    remaining -= 1
    finally:
        _abort_all(state, by_seq)
    _note_cache(job, sink)
    return json_response(responses.completion_body(job))


async def _stream(
    request: web.Request, state: SimState, job: chat.ChatJob, faults: Faults, arrived: float
) -> web.StreamResponse:
    resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
    sink, by_seq = _submit(state, job)
    remaining = len(by_seq)
    sent_content = 0
    stalled = False
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
            await resp.write(responses.error_event(faults.fail_message) + b"data: [DONE]\n\n")
            return resp
        while remaining:
            for token in await sink.next_tokens():
                choice = by_seq[token.request_id]
                last = token.finish_reason is not None
                if last:
                    remaining -= 1
                out = b""
                if token.index == 0:
                    out += responses.role_chunk(job, choice.index)
                final_of_stream = last and remaining == 0 and not job.include_usage
                out += responses.content_chunk(job, choice, token.index, last, final_of_stream)
                if faults.stall_s is not None and not stalled and sent_content >= faults.stall_after_tokens:
                    stalled = True
                    await asyncio.sleep(faults.stall_s)
                await resp.write(out)
                if timing is not None and first_content is None:
                    # The role chunk and the first content chunk go out in this one write.
                    first_content = time.monotonic()
                sent_content += 1
                if faults.die_after_tokens is not None and sent_content >= faults.die_after_tokens:
                    _drop_connection(request)
                    return resp
                if faults.error_after_tokens is not None and sent_content >= faults.error_after_tokens:
                    await resp.write(responses.error_event(faults.fail_message) + b"data: [DONE]\n\n")
                    return resp
        tail = b""
        _note_cache(job, sink)
        if job.include_usage:
            tail += responses.usage_chunk(job, sum(c.target_tokens for c in job.choices))
        await resp.write(tail + b"data: [DONE]\n\n")
        await resp.write_eof()
    except ConnectionResetError:
        pass  # the client went away; the finally block aborts the sequences
    finally:
        _abort_all(state, by_seq)
        if timing is not None:
            if first_content is not None:
                timing.record(job.user, arrived, first_content)
            timing.stream_ended()
    return resp


def _drop_connection(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()


async def models(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    now = int(time.time())
    card = {
        "id": state.served_model,
        "object": "model",
        "created": now,
        "owned_by": "vllm",
        "root": state.profile.root,
        "parent": None,
        "max_model_len": state.profile.max_model_len,
        "permission": [
            {
                "id": f"modelperm-{uuid.uuid4().hex[:16]}",
                "object": "model_permission",
                "created": now,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }
    return json_response({"object": "list", "data": [card]})


async def tokenize(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    try:
        body = chat.parse_body(await request.read())
        if not isinstance(body, dict):
            raise chat.VllmError(400, "Bad Request", "body must be a JSON object", "body")
        model = body.get("model")
        if model not in (None, "", state.served_model):
            raise chat.VllmError(
                404,
                "NotFoundError",
                f"The model `{model}` does not exist. Valid aliases: {state.served_model}.",
                "model",
            )
        if isinstance(body.get("messages"), list):
            pieces = textgen.chat_prompt_pieces(
                body["messages"],
                bool(body.get("add_generation_prompt", True)),
                continue_final=bool(body.get("continue_final_message", False)),
            )
        elif isinstance(body.get("prompt"), str):
            pieces = textgen.text_tokens(body["prompt"])
            if body.get("add_special_tokens", True):
                pieces = [textgen.BOS, *pieces]
        else:
            raise chat.VllmError(
                400, "Bad Request", "1 validation error:\n  either `prompt` or `messages` is required", "body"
            )
    except chat.VllmError as exc:
        return _error(exc)
    token_strs = pieces if body.get("return_token_strs") else None
    return json_response(
        {
            "count": len(pieces),
            "max_model_len": state.profile.max_model_len,
            "tokens": textgen.token_ids(pieces),
            "token_strs": token_strs,
        }
    )


async def health(request: web.Request) -> web.Response:
    # vLLM >= 0.11: 503 with an empty body once the engine is dead.
    return web.Response(status=503 if request.app[STATE_KEY].engine.dead else 200)


async def version(request: web.Request) -> web.Response:
    return json_response({"version": chat.VLLM_VERSION})


async def load(request: web.Request) -> web.Response:
    return json_response({"server_load": 0})


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    body = generate_latest(state.metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def get_faults(request: web.Request) -> web.Response:
    return json_response(request.app[STATE_KEY].faults.current.model_dump())


async def set_faults(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    try:
        data: Any = await request.json()
        faults = Faults.model_validate(data)
    except (ValueError, ValidationError) as exc:
        return json_response(
            {
                "error": {
                    "message": f"invalid faults: {exc}",
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                }
            },
            status=400,
        )
    state.faults.set(faults)
    return json_response(faults.model_dump())


async def clear_faults(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    state.faults.clear()
    return json_response(state.faults.current.model_dump())


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_get("/health", health)
    app.router.add_get("/ping", health)
    app.router.add_get("/version", version)
    app.router.add_get("/load", load)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/_sim/faults", get_faults)
    app.router.add_post("/_sim/faults", set_faults)
    app.router.add_delete("/_sim/faults", clear_faults)
