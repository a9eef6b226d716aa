"""What the response cache may answer, and its match keys (`apps.core.respcache.keys`)."""

from __future__ import annotations

from typing import Any

import pytest

from apps.core.respcache.keys import bypass_reason, match_keys
from apps.core.respcache.policy import CachePolicy

pytestmark = pytest.mark.timeout(10)

POLICY = CachePolicy.model_validate({"models": {"m": {}}})
WARM = CachePolicy.model_validate({"models": {"m": {}}, "max_temperature": 0.5})
BASE: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}


@pytest.mark.parametrize(
    ("endpoint", "change", "policy", "reason"),
    [
        ("chat", {}, POLICY, None),
        ("completions", {"prompt": "hi", "messages": None}, POLICY, None),
        ("embeddings", {}, POLICY, "endpoint"),
        ("chat", {"n": 2}, POLICY, "n"),
        ("chat", {"n": 1}, POLICY, None),
        ("chat", {"temperature": None}, POLICY, "temperature"),  # vLLM's default is 1.0
        ("chat", {"temperature": 0.5}, POLICY, "temperature"),
        ("chat", {"temperature": 0.5}, WARM, None),
        ("chat", {"temperature": 0.6}, WARM, "temperature"),
        ("chat", {"tools": [{"type": "function", "function": {"name": "f"}}]}, POLICY, "tools"),
        ("chat", {"tool_choice": "none"}, POLICY, None),
        ("chat", {"logprobs": True}, POLICY, "logprobs"),
        ("chat", {"logprobs": False}, POLICY, None),
        ("completions", {"echo": True}, POLICY, "logprobs"),
        ("chat", {"stream_options": {"include_usage": True}}, POLICY, None),
        ("chat", {"stream_options": {"continuous_usage_stats": True}}, POLICY, "stream_options"),
        (
            "chat",
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            POLICY,
            "content",
        ),
        ("chat", {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]}, POLICY, None),
    ],
)
def test_what_is_never_cached(
    endpoint: str, change: dict[str, Any], policy: CachePolicy, reason: str | None
) -> None:
    body = {k: v for k, v in {**BASE, **change}.items() if v is not None or k == "temperature"}
    assert bypass_reason(endpoint, body, policy) == reason


def test_the_exact_key_ignores_what_does_not_change_the_answer() -> None:
    key = b"k" * 32
    plain = match_keys("chat", BASE, key)
    same = {**BASE, "stream": True, "stream_options": {"include_usage": True}, "user": "u", "seed": None}
    assert match_keys("chat", same, key).exact == plain.exact
    reordered = dict(reversed(list(BASE.items())))
    assert match_keys("chat", reordered, key).exact == plain.exact
    assert match_keys("chat", {**BASE, "max_tokens": 5}, key).exact != plain.exact
    assert match_keys("chat", {**BASE, "seed": 1}, key).exact != plain.exact
    assert match_keys("completions", BASE, key).exact != plain.exact  # the endpoint is part of it


def test_keys_are_per_team_and_the_context_leaves_out_the_last_user_turn() -> None:
    a, b = match_keys("chat", BASE, b"a" * 32), match_keys("chat", BASE, b"b" * 32)
    assert a.exact != b.exact
    assert a.context != b.context
    other_question = {**BASE, "messages": [{"role": "user", "content": "hello there"}]}
    c = match_keys("chat", other_question, b"a" * 32)
    assert c.context == a.context
    assert c.exact != a.exact
    assert (a.query, c.query) == ("hi", "hello there")
    system = {**other_question, "messages": [{"role": "system", "content": "x"}, *other_question["messages"]]}
    assert match_keys("chat", system, b"a" * 32).context != a.context


def test_no_semantic_query_without_a_last_user_text() -> None:
    assistant_last = {**BASE, "messages": [*BASE["messages"], {"role": "assistant", "content": "yo"}]}
    assert match_keys("chat", assistant_last, b"k").query is None
    assert match_keys("completions", {"model": "m", "prompt": [1, 2, 3]}, b"k").query is None
    assert match_keys("completions", {"model": "m", "prompt": "once"}, b"k").query == "once"
