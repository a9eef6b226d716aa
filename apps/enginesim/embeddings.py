"""Embedding requests (`POST /v1/embeddings`, a `--runner pooling` engine) as vLLM 0.32 validates
them, and the body it answers with (measured: `docs/enginesim.md`, "Legacy completions and
embeddings").

`input` is a string, a list of strings, a list of token ids or a list of id lists (`prompts.py`);
each entry is one prefill-only sequence through the engine (`generation.prefill`) and one `data`
item, whose vector is `vectors.embed()` (`--embedding-dim` values, unit norm). `usage` counts the
prompt tokens (`prompt_tokens` = `total_tokens`, `completion_tokens` 0). `encoding_format` `float`
(default) or `base64` (the values' bytes, in `embed_dtype` float32 (default) or float16 and
`endianness`: "native", vLLM's default, is little-endian on x86).

vLLM's order of checks: the request model (a body that is not an object is refused by each of its
five request models), the model (404, with no "Valid aliases" and no `param`, unlike chat),
`truncate_prompt_tokens` against the context, an empty input list, each input's length, then
`dimensions` (refused: the model has no Matryoshka embeddings), then the engine's input checks
(an empty input, an id outside the vocabulary). Not simulated (a 400 that says so): the `bytes`
encodings, `embed_dtype` bfloat16 and fp8. The chat-style `messages` input is not simulated either.
"""

from __future__ import annotations

import base64
import struct
import time
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from apps.enginesim import vectors
from apps.enginesim.errors import VllmError, bad_request, not_an_object, validation_error
from apps.enginesim.prompts import Prompt, engine_rejection, no_prompt, prompt_list, tokenized, too_long

_ENDIAN = {"native": "=", "little": "<", "big": ">"}
_DTYPE = {"float32": "f", "float16": "e"}
REQUEST_MODELS = 5  # vLLM's embedding request is a union of five request models


class EngineEmbeddingBody(BaseModel):
    """The fields enginesim acts on, typed as vLLM's `EmbeddingCompletionRequest`."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    input: list[int] | list[list[int]] | str | list[str]
    encoding_format: Literal["float", "base64", "bytes", "bytes_only"] = "float"
    embed_dtype: Literal["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"] = "float32"
    endianness: Literal["native", "big", "little"] = "native"
    dimensions: int | None = None
    truncate_prompt_tokens: Annotated[int, Field(ge=-1)] | None = None
    user: str | None = None
    priority: int = 0


@dataclass
class EmbeddingJob:
    request_id: str
    model: str
    created: int
    prompts: list[Prompt]  # one per `data` item
    encoding_format: str = "float"
    embed_dtype: str = "float32"
    endianness: str = "native"
    priority: int = 0

    @property
    def prompt_tokens(self) -> int:
        return sum(p.tokens for p in self.prompts)


def plan_embedding(body: Any, *, served_model: str, max_model_len: int) -> EmbeddingJob:
    req = _checked_request(body, served_model)
    keep = req.truncate_prompt_tokens
    if keep is not None and keep > max_model_len:
        raise bad_request(
            "truncate_prompt_tokens value is greater than max_model_len. Please request a smaller truncation size."
        )
    prompts = [_truncated(tokenized(item), keep, max_model_len) for item in prompt_list(req.input)]
    if not prompts:
        raise no_prompt()
    for prompt in prompts:
        if (error := too_long(prompt, max_model_len)) is not None:
            raise error
    if req.dimensions is not None:
        raise bad_request(
            f"Model {served_model!r} does not support Matryoshka embeddings; dimensions must be unset "
            f"(received dimensions={req.dimensions})."
        )
    for prompt in prompts:
        if (rejected := engine_rejection(prompt)) is not None:
            raise rejected
    return EmbeddingJob(
        request_id=f"embd-{uuid.uuid4().hex[:16]}",
        model=served_model,
        created=int(time.time()),
        prompts=prompts,
        encoding_format=req.encoding_format,
        embed_dtype=req.embed_dtype,
        endianness=req.endianness,
        priority=req.priority,
    )


def _checked_request(body: Any, served_model: str) -> EngineEmbeddingBody:
    if not isinstance(body, dict):
        raise not_an_object(body, copies=REQUEST_MODELS)
    try:
        req = EngineEmbeddingBody.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    if req.model not in (None, "", served_model):
        raise VllmError(404, "NotFoundError", f"The model `{req.model}` does not exist.")
    if req.encoding_format in ("bytes", "bytes_only"):
        raise bad_request(f"encoding_format {req.encoding_format!r} is not simulated by enginesim")
    if req.embed_dtype not in _DTYPE:
        raise bad_request(f"embed_dtype {req.embed_dtype!r} is not simulated by enginesim")
    return req


def _truncated(prompt: Prompt, keep: int | None, max_model_len: int) -> Prompt:
    """`truncate_prompt_tokens` (-1: the context) keeps the first tokens: the count and the ids are
    cut (a text's vector still reads the whole text)."""
    if keep is None:
        return prompt
    limit = max_model_len if keep == -1 else keep
    if prompt.tokens <= limit:
        return prompt
    return Prompt(limit, prompt.ids[:limit], prompt.fingerprint, prompt.text)


def encode(vec: list[float], encoding_format: str, embed_dtype: str, endianness: str) -> list[float] | str:
    """One vector as vLLM writes it: the floats, or base64 of their `embed_dtype` bytes."""
    if encoding_format == "float":
        return vec
    raw = struct.pack(f"{_ENDIAN[endianness]}{len(vec)}{_DTYPE[embed_dtype]}", *vec)
    return base64.b64encode(raw).decode("ascii")


def embedding_body(job: EmbeddingJob, dim: int) -> dict[str, Any]:
    """The response: one `embedding` item per input, in order, and the prompt tokens as usage."""
    data = [
        {
            "index": index,
            "object": "embedding",
            "embedding": encode(
                vectors.embed(prompt.source, dim), job.encoding_format, job.embed_dtype, job.endianness
            ),
        }
        for index, prompt in enumerate(job.prompts)
    ]
    total = job.prompt_tokens
    return {
        "id": job.request_id,
        "object": "list",
        "created": job.created,
        "model": job.model,
        "data": data,
        "usage": {
            "prompt_tokens": total,
            "total_tokens": total,
            "completion_tokens": 0,
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        },
    }


__all__ = ["EmbeddingJob", "EngineEmbeddingBody", "VllmError", "embedding_body", "plan_embedding"]
