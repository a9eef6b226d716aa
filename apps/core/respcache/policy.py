"""A team's response cache settings: the JSON document the admin API stores (`CachePolicy`) and its
validation into one error naming the field (`parse_cache_policy`). Off by default: a team without a
policy, or a model the policy does not name, is never cached. The fields: docs/response-cache.md.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from apps.core.errors import InvalidRequest

DAY_S = 86_400
MIB = 1024 * 1024


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelCache(_Strict):
    """One chat model's cache: exact matches always; semantic ones at or above `semantic_threshold`
    (the cosine similarity of the last user turn's embeddings; None: exact only)."""

    semantic_threshold: Annotated[float, Field(gt=0.0, le=1.0)] | None = None


class CachePolicy(_Strict):
    models: dict[Annotated[StrictStr, Field(min_length=1, max_length=128)], ModelCache] = Field(
        min_length=1, max_length=64
    )
    ttl_s: Annotated[int, Field(ge=60, le=30 * DAY_S)] = 3600
    max_bytes: Annotated[int, Field(ge=MIB, le=16 * 1024 * MIB)] = 256 * MIB
    # Requests sampled above this temperature (vLLM's default, 1.0, when the request names none) are
    # never cached: their answer is one draw among many, and a replay would always give the same one.
    max_temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 0.0
    # The fleet's embedding model for semantic matches (None: the stack's only one, when it has one).
    embedding_model: Annotated[StrictStr, Field(min_length=1, max_length=128)] | None = None

    @property
    def semantic(self) -> bool:
        return any(m.semantic_threshold is not None for m in self.models.values())

    def as_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def parse_cache_policy(
    data: object, *, chat_models: Collection[str], embed_models: Collection[str]
) -> CachePolicy:
    """The validated policy with `embedding_model` filled in where a semantic match needs it, or
    `InvalidRequest` naming the first bad field (`param`: `models.<name>.semantic_threshold`, ...)."""
    if not isinstance(data, dict):
        raise InvalidRequest("A response cache policy is a JSON object.", param="policy")
    try:
        policy = CachePolicy.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        path = ".".join(str(part) for part in first["loc"]) or "policy"
        reason = first["msg"].removeprefix("Value error, ")
        raise InvalidRequest(f"{path}: {reason}", param=path) from None
    for name in policy.models:
        if name not in chat_models:
            raise InvalidRequest(
                f"models.{name[:128]}: not a chat model of this stack (only chat and completion answers are cached)",
                param=f"models.{name[:128]}",
            )
    if not policy.semantic:
        return policy
    embedder = policy.embedding_model
    if embedder is None:
        if len(embed_models) != 1:
            raise InvalidRequest(
                "embedding_model: name the embedding model for semantic matches "
                f"(this stack has {len(embed_models)})",
                param="embedding_model",
            )
        embedder = next(iter(embed_models))
    elif embedder not in embed_models:
        raise InvalidRequest(
            f"embedding_model: '{embedder[:128]}' is not an embedding model of this stack",
            param="embedding_model",
        )
    return policy.model_copy(update={"embedding_model": embedder})
