"""Scripted vLLM responses (aiohttp) for what enginesim does not produce: the agent's unit tests of
other vLLM versions' and set-ups' wire variants. Everything else runs against enginesim in-process
(`tests/fakes/engine_sim.py`): this is the engine boundary scripted, not a second engine.

The variants: error bodies in every shape vLLM has used (nested, flat, the API-key middleware's
`{"error": "Unauthorized"}`), an in-stream error before any chunk, several tokens merged into one
chunk, an engine without per-chunk usage or without the final usage chunk, exact pacing (one token
per piece), set gauges under the old KV metric name, a failing `/metrics` or `/health`, and the
request bodies the engine received.

Speaks what the agent uses: streaming `/v1/chat/completions` (role chunk, one chunk per
token, finish chunk, usage chunk only with `stream_options.include_usage`, `[DONE]`),
`/metrics` (vllm:* gauges, old or new KV name), `POST /tokenize`, `/health`,
`/v1/models`. Each request's behaviour comes from an `x_fake` object in its body (vLLM
ignores unknown fields, so the agent forwards it untouched):

    {"tokens": 5, "pace_s": 0, "prompt_tokens": 12,
     "mode": "ok" | "http_error" | "stream_error" | "no_usage" | "infinite",
     "status": 400, "shape": "nested" | "flat" | "unauthorized", "after": 0,
     "tokens_per_chunk": 1, "chunk_usage": true}

`tokens` is the number of content chunks; each stands for `tokens_per_chunk` generated tokens
(vLLM merges tokens into one chunk when its HTTP side falls behind). With
`stream_options: {"include_usage": true, "continuous_usage_stats": true}` every chunk carries
the running usage, placed as vLLM 0.32 places it, unless `chunk_usage` is false (an engine
without the option).

Client disconnects are recorded in `aborted` (request ids, in order) with an event.
"""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from apps.core.protocol.openai import sse_event
from apps.core.protocol.vllm import chunk_payload, delta_choice, usage_block

MODEL = "fake-8b"
CREATED = 1730000000


def _chunk(
    cid: str,
    model: str,
    delta: dict[str, Any],
    finish: str | None = None,
    usage: dict[str, Any] | None = None,
) -> bytes:
    choice = delta_choice(delta, finish)
    if "role" not in delta:
        choice["token_ids"] = None
    if finish is not None:
        choice["stop_reason"] = None
    extra = {"usage": usage} if usage is not None else None
    return sse_event(chunk_payload(cid, model, CREATED, [choice], extra))


def running_usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """vLLM 0.32's per-chunk usage (`continuous_usage_stats`)."""
    return {**usage_block(prompt_tokens, completion_tokens), "completion_tokens_details": None}


def _error_body(shape: str, status: int, message: str) -> dict[str, Any]:
    if shape == "flat":
        return {
            "object": "error",
            "message": message,
            "type": "BadRequestError",
            "param": None,
            "code": status,
        }
    if shape == "unauthorized":
        return {"error": "Unauthorized"}
    return {"error": {"message": message, "type": "BadRequestError", "param": "max_tokens", "code": status}}


def _stream_error(message: str, error_type: str, code: int) -> bytes:
    """vLLM's in-stream error event (the status is already 200), then `[DONE]`."""
    err = json.dumps({"error": {"message": message, "type": error_type, "param": None, "code": code}})
    return b"data: " + err.encode() + b"\n\n" + b"data: [DONE]\n\n"


@dataclass
class FakeEngine:
    model: str = MODEL
    healthy: bool = True
    waiting: float = 0.0
    running: float = 0.0
    kv: float = 0.0
    old_kv_name: bool = False
    metrics_ok: bool = True
    max_model_len: int = 4096
    tokenize_count: int = 12
    requests: list[dict[str, Any]] = field(default_factory=list)
    tokenize_requests: list[dict[str, Any]] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    generated: dict[str, int] = field(default_factory=dict)  # request id -> tokens written
    port: int = 0
    _runner: web.AppRunner | None = None
    _abort_event: asyncio.Event = field(default_factory=asyncio.Event)
    _n: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", self.port))
        self.port = sock.getsockname()[1]
        site = web.SockSite(self._runner, sock)
        await site.start()
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def wait_aborted(self, count: int = 1, timeout: float = 5.0) -> list[str]:
        async with asyncio.timeout(timeout):
            while len(self.aborted) < count:
                self._abort_event.clear()
                await self._abort_event.wait()
        return list(self.aborted)

    # -- handlers -----------------------------------------------------------------------

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 503)

    async def _models(self, _: web.Request) -> web.Response:
        card = {"id": self.model, "object": "model", "owned_by": "vllm", "max_model_len": self.max_model_len}
        return web.json_response({"object": "list", "data": [card]})

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.tokenize_requests.append(body)
        if not self.healthy:
            return web.Response(status=503)
        return web.json_response(
            {
                "count": self.tokenize_count,
                "max_model_len": self.max_model_len,
                "tokens": [],
                "token_strs": None,
            }
        )

    async def _metrics(self, _: web.Request) -> web.Response:
        if not self.metrics_ok:
            return web.Response(status=500)
        kv_name = "vllm:gpu_cache_usage_perc" if self.old_kv_name else "vllm:kv_cache_usage_perc"
        labels = f'{{engine="0",model_name="{self.model}"}}'
        text = (
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{labels} {self.running}\n"
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{labels} {self.waiting}\n"
            f"# HELP {kv_name} KV-cache usage. 1 means 100 percent usage.\n"
            f"# TYPE {kv_name} gauge\n"
            f"{kv_name}{labels} {self.kv}\n"
        )
        return web.Response(text=text, content_type="text/plain")

    async def _embeddings(self, request: web.Request) -> web.Response:
        """`x_fake`: `{"mode": "ok" | "no_usage" | "pretty" | "huge" | "http_error", "dims": 4}`: a
        normal answer, one without usage, one written over several lines, one of `huge` bytes."""
        body = await request.json()
        self.requests.append(body)
        fake: dict[str, Any] = body.get("x_fake") or {}
        mode = fake.get("mode", "ok")
        if mode == "http_error":
            status = int(fake.get("status", 400))
            return web.json_response(_error_body("nested", status, "bad input"), status=status)
        dims = int(fake.get("dims", 4))
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = [{"object": "embedding", "index": i, "embedding": [0.5] * dims} for i in range(len(inputs))]
        answer: dict[str, Any] = {
            "id": "embd-fake",
            "object": "list",
            "created": CREATED,
            "model": self.model,
        }
        answer["data"] = data
        if mode != "no_usage":
            answer["usage"] = {"prompt_tokens": 3 * len(inputs), "total_tokens": 3 * len(inputs)}
        if mode == "huge":
            answer["padding"] = "x" * int(fake["huge"])
        text = json.dumps(answer, indent=2 if mode == "pretty" else None)
        return web.Response(text=text, content_type="application/json")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self._n += 1
        rid = f"chatcmpl-fake-{self._n}"
        fake: dict[str, Any] = body.get("x_fake") or {}
        mode = fake.get("mode", "ok")
        status = int(fake.get("status", 400))
        if mode == "http_error":
            shape = fake.get("shape", "nested")
            return web.json_response(_error_body(shape, status, "bad max_tokens"), status=status)
        tokens = int(fake.get("tokens", 5))
        pace = float(fake.get("pace_s", 0.0))
        after = int(fake.get("after", 0))
        prompt_tokens = int(fake.get("prompt_tokens", 12))
        opts = body.get("stream_options")
        include_usage = isinstance(opts, dict) and opts.get("include_usage") is True and mode != "no_usage"
        continuous = (
            include_usage
            and isinstance(opts, dict)
            and opts.get("continuous_usage_stats") is True
            and fake.get("chunk_usage", True) is True
        )
        per_chunk = int(fake.get("tokens_per_chunk", 1))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        written = 0
        try:
            if mode == "stream_error" and after == 0:
                await resp.write(_stream_error("bad logprobs", "BadRequestError", 400))
                return resp
            role_usage = running_usage(prompt_tokens, 0) if continuous else None
            await resp.write(_chunk(rid, self.model, {"role": "assistant", "content": ""}, usage=role_usage))
            i = 0
            while mode == "infinite" or i < tokens:
                if mode == "stream_error" and i == after:
                    break
                if pace:
                    await asyncio.sleep(pace)
                last = mode != "infinite" and i == tokens - 1
                written += per_chunk
                usage = running_usage(prompt_tokens, written) if continuous else None
                await resp.write(
                    _chunk(rid, self.model, {"content": f"t{i} "}, "length" if last else None, usage)
                )
                self.generated[rid] = written
                i += 1
            if mode == "stream_error":
                await resp.write(_stream_error("EngineCore died", "InternalServerError", 500))
                return resp
            if include_usage:
                usage = {"usage": usage_block(prompt_tokens, written)}
                await resp.write(sse_event(chunk_payload(rid, self.model, CREATED, [], usage)))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            self.aborted.append(rid)
            self._abort_event.set()
            raise
        return resp
