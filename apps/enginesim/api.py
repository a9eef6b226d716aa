"""HTTP routes of the simulator: vLLM's OpenAI-compatible surface plus `/_sim/faults`.

Which endpoints an engine serves follows vLLM 0.32's `--runner`: a generate engine serves
`POST /v1/chat/completions` and `POST /v1/completions`, a pooling engine `POST /v1/embeddings`;
both serve `/v1/models`, `/tokenize`, `/health`, `/version`, `/load` and `/metrics`. Any other path
(the other runner's endpoints too) answers `404 {"detail":"Not Found"}` and a wrong method `405`, as
vLLM's router does (not its error envelope).

A generation request is planned by its endpoint's module (`chat.py`, `completions.py`) and run by
`generation.py`, one scheduler sequence per choice; an embedding (`embeddings.py`) is a
prefill-only sequence per input. A refusal of the engine's input checks (`prompts.EngineInputError`)
reaches a stream as an error event after its 200, as in vLLM. Injected faults (`faults.py`) hit
chat and completion requests; `fail_status` hits embeddings too.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from apps.enginesim import (
    chat,
    completion_bodies,
    completions,
    embeddings,
    errors,
    generation,
    responses,
    textgen,
)
from apps.enginesim.faults import Faults
from apps.enginesim.prompts import EngineInputError
from apps.enginesim.state import (
    STATE_KEY,
    SimState,
    TimingLog,
    error_response,
    fault_error,
    json_response,
)

__all__ = ["STATE_KEY", "SimState", "TimingLog", "add_routes", "json_response"]

Job = TypeVar("Job", bound=chat.ChatJob)


async def _generate(
    request: web.Request,
    plan: Callable[[SimState, Any], Job],
    stream_format: Callable[[Job], generation.StreamFormat],
    body_of: Callable[[Job], dict[str, Any]],
) -> web.StreamResponse:
    """One generation request: faults, the endpoint's plan (or its error), then the stream or
    the whole body."""
    state = request.app[STATE_KEY]
    arrived = time.monotonic() if state.timing is not None else 0.0  # before the body is read
    faults = state.faults.take()
    if faults.fail_status is not None:
        return error_response(fault_error(faults.fail_status, faults.fail_message))
    try:
        job = plan(state, errors.parse_body(await request.read()))
    except EngineInputError as exc:
        return await generation.stream_error(request, exc) if exc.stream else error_response(exc)
    except errors.VllmError as exc:
        return error_response(exc)
    if job.stream:
        return await generation.stream(request, state, job, stream_format(job), faults, arrived)
    await generation.collect(state, job)  # no first content chunk, so nothing for the timing log
    return json_response(body_of(job))


def _plan_chat(state: SimState, body: Any) -> chat.ChatJob:
    return chat.plan_chat(
        body,
        served_model=state.served_model,
        max_model_len=state.profile.max_model_len,
        mean_answer_tokens=state.profile.mean_answer_tokens,
        server_seed=state.seed,
    )


def _plan_completion(state: SimState, body: Any) -> completions.CompletionJob:
    return completions.plan_completion(
        body,
        served_model=state.served_model,
        max_model_len=state.profile.max_model_len,
        mean_answer_tokens=state.profile.mean_answer_tokens,
        server_seed=state.seed,
    )


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, _plan_chat, responses.ChatFormat, responses.completion_body)


async def legacy_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(
        request, _plan_completion, completion_bodies.CompletionFormat, completion_bodies.completion_body
    )


async def create_embeddings(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    faults = state.faults.take()
    if faults.fail_status is not None:
        return error_response(fault_error(faults.fail_status, faults.fail_message))
    try:
        job = embeddings.plan_embedding(
            errors.parse_body(await request.read()),
            served_model=state.served_model,
            max_model_len=state.profile.max_model_len,
        )
    except errors.VllmError as exc:
        return error_response(exc)
    await generation.prefill(state, job.request_id, job.prompts, job.priority)
    return json_response(embeddings.embedding_body(job, state.embedding_dim))


@web.middleware
async def vllm_http_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """An unknown path or a wrong method as vLLM answers it (Starlette's router, not vLLM's error
    envelope: measured `{"detail":"Not Found"}`)."""
    try:
        return await handler(request)
    except (web.HTTPNotFound, web.HTTPMethodNotAllowed) as exc:
        phrase = "Not Found" if exc.status == 404 else "Method Not Allowed"
        return json_response({"detail": phrase}, status=exc.status)


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
        body = errors.parse_body(await request.read())
        if not isinstance(body, dict):
            raise errors.VllmError(400, "Bad Request", "body must be a JSON object", "body")
        model = body.get("model")
        if model not in (None, "", state.served_model):
            raise errors.unknown_model(model, state.served_model)
        if isinstance(body.get("messages"), list):
            pieces = textgen.chat_prompt_pieces(
                body["messages"],
                bool(body.get("add_generation_prompt", True)),
                continue_final=bool(body.get("continue_final_message", False)),
            )
        elif isinstance(body.get("prompt"), str):
            pieces = textgen.text_tokens(body["prompt"])  # no BOS, as the tiny model's tokenizer
        else:
            raise errors.VllmError(
                400, "Bad Request", "1 validation error:\n  either `prompt` or `messages` is required", "body"
            )
    except errors.VllmError as exc:
        return error_response(exc)
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
    """The routes of the engine's runner (`SimState.runner`)."""
    app.middlewares.append(vllm_http_errors)
    if app[STATE_KEY].runner == "pooling":
        app.router.add_post("/v1/embeddings", create_embeddings)
    else:
        app.router.add_post("/v1/chat/completions", chat_completions)
        app.router.add_post("/v1/completions", legacy_completions)
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
