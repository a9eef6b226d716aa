"""Continuing an assistant message (`continue_final_message: true`, `add_generation_prompt: false`):
what the orchestrator's stream resume sends to the second node (docs/control-plane.md, "Resume").

Checked on both engines: the request is accepted, the rendered prompt is the conversation followed by
the given assistant text with no end-of-message and no new assistant header (so the first generated
token follows that text), the stream has the usual shape (one role chunk, content, usage), and
`max_tokens` bounds the continuation alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conformance.conftest import EngineUnderTest
from tests.conformance.helpers import chat_body, stream_chat


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60.0) as c:
        yield c


def _tokenize(client: httpx.Client, engine: EngineUnderTest, **body: Any) -> list[int]:
    resp = client.post(f"{engine.url}/tokenize", json={"model": engine.model, **body})
    assert resp.status_code == 200, resp.text
    tokens: list[int] = resp.json()["tokens"]
    return tokens


def _text(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))


def test_continuation_prompt_ends_with_the_given_text(engine: EngineUnderTest, client: httpx.Client) -> None:
    user = [{"role": "user", "content": "hi"}]
    given = " the river"
    opened = _tokenize(client, engine, messages=user, add_generation_prompt=True)
    continued = _tokenize(
        client,
        engine,
        messages=[*user, {"role": "assistant", "content": given}],
        add_generation_prompt=False,
        continue_final_message=True,
    )
    # The assistant header of the generation prompt, then the given text's tokens, and nothing
    # after them (no end-of-sequence, no newline): the model continues right after the text.
    assert continued[: len(opened)] == opened
    tail = continued[len(opened) :]
    assert 1 <= len(tail) <= len(given.split()) + 2
    closed = _tokenize(client, engine, messages=[*user, {"role": "assistant", "content": given}])
    assert len(closed) > len(continued)  # the closed message adds its end and a new header


def test_stream_continues_the_given_text(engine: EngineUnderTest, client: httpx.Client) -> None:
    base = chat_body(
        engine.model,
        max_tokens=8,
        ignore_eos=True,
        temperature=0,
        seed=11,
        stream=True,
        stream_options={"include_usage": True},
    )
    original = stream_chat(client, engine.url, base)
    assert original.status == 200
    pieces = [c["choices"][0]["delta"].get("content") or "" for c in original.chunks[1:-1]]
    delivered = "".join(pieces[:3])
    assert delivered.strip()
    body = {
        **base,
        "messages": [*base["messages"], {"role": "assistant", "content": delivered}],
        "add_generation_prompt": False,
        "continue_final_message": True,
        "max_tokens": 5,
    }
    res = stream_chat(client, engine.url, body)
    assert res.status == 200, res.payloads
    assert res.payloads[-1] == "[DONE]"
    chunks = res.chunks
    # One role chunk (the final message's role), as for a fresh answer: the resume drops it.
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert not any("role" in c["choices"][0]["delta"] for c in chunks[1:] if c["choices"])
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == 5  # max_tokens counts the continuation only
    prompt = _tokenize(
        client,
        engine,
        messages=body["messages"],
        add_generation_prompt=False,
        continue_final_message=True,
    )
    assert usage["prompt_tokens"] == len(prompt)
    continuation = _text(chunks)
    assert continuation
    if engine.kind == "enginesim":
        # enginesim draws the answer the conversation would have got and picks it up after the
        # given text: delivered + continuation is the uninterrupted answer.
        assert delivered + continuation == "".join(pieces)


def test_both_switches_on_is_rejected(engine: EngineUnderTest, client: httpx.Client) -> None:
    body = chat_body(
        engine.model,
        max_tokens=2,
        messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": " the"}],
        add_generation_prompt=True,
        continue_final_message=True,
    )
    resp = client.post(f"{engine.url}/v1/chat/completions", json=body)
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == 400
