"""The response cache policy document (`apps.core.respcache.policy`): one error naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from apps.core.errors import InvalidRequest
from apps.core.respcache.policy import parse_cache_policy

pytestmark = pytest.mark.timeout(10)

CHAT, EMBED = ["llama", "qwen"], ["bge"]


def parse(doc: Any, embed: list[str] | None = None) -> Any:
    return parse_cache_policy(doc, chat_models=CHAT, embed_models=EMBED if embed is None else embed)


def test_defaults_and_the_only_embedding_model() -> None:
    policy = parse({"models": {"llama": {"semantic_threshold": 0.9}}})
    assert (policy.ttl_s, policy.max_temperature, policy.embedding_model) == (3600, 0.0, "bge")
    assert policy.semantic
    exact = parse({"models": {"llama": {}}})
    assert exact.embedding_model is None
    assert not exact.semantic


@pytest.mark.parametrize(
    ("doc", "param"),
    [
        ([], "policy"),
        ({}, "models"),
        ({"models": {}}, "models"),
        ({"models": {"bge": {}}}, "models.bge"),  # an embedding model's answers are not cached
        ({"models": {"nope": {}}}, "models.nope"),
        ({"models": {"llama": {"semantic_threshold": 0}}}, "models.llama.semantic_threshold"),
        ({"models": {"llama": {"semantic_threshold": 1.5}}}, "models.llama.semantic_threshold"),
        ({"models": {"llama": {"other": 1}}}, "models.llama.other"),
        ({"models": {"llama": {}}, "ttl_s": 5}, "ttl_s"),
        ({"models": {"llama": {}}, "max_bytes": 10}, "max_bytes"),
        ({"models": {"llama": {}}, "max_temperature": 3}, "max_temperature"),
        ({"models": {"llama": {"semantic_threshold": 0.9}}, "embedding_model": "llama"}, "embedding_model"),
        ({"models": {"llama": {}}, "surprise": True}, "surprise"),
    ],
)
def test_a_bad_document_names_its_field(doc: Any, param: str) -> None:
    with pytest.raises(InvalidRequest) as bad:
        parse(doc)
    assert bad.value.param == param


def test_semantic_needs_a_named_model_when_the_stack_has_several_or_none() -> None:
    with pytest.raises(InvalidRequest) as bad:
        parse({"models": {"llama": {"semantic_threshold": 0.9}}}, embed=[])
    assert bad.value.param == "embedding_model"
    named = parse(
        {"models": {"llama": {"semantic_threshold": 0.9}}, "embedding_model": "b2"}, embed=["bge", "b2"]
    )
    assert named.embedding_model == "b2"
