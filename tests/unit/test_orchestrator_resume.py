"""The resume's pure parts (apps/orchestrator/resume.py): what was delivered, the continuation
request, the splice at the seam and the billing rule."""

from __future__ import annotations

import json
from typing import Any

import pytest

from apps.core.budget import Budget
from apps.core.protocol.dispatch import DispatchRequest
from apps.core.protocol.openai import sse_event
from apps.core.protocol.vllm import chunk_payload, delta_choice, usage_block
from apps.orchestrator.resume import (
    Continuation,
    Splice,
    billed,
    can_resume,
    continuation,
    delivered,
    resumable,
)

BODY: dict[str, Any] = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "stream": True,
    "max_tokens": 6,
}


def ev(chunk_id: str, delta: dict[str, Any], finish: str | None = None, created: int = 1) -> str:
    return sse_event(chunk_payload(chunk_id, "m", created, [delta_choice(delta, finish)])).decode()


def role(chunk_id: str, created: int = 1) -> str:
    return ev(chunk_id, {"role": "assistant", "content": ""}, created=created)


def payloads(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(e.removeprefix(b"data: ")) for e in data.split(b"\n\n") if e]


def test_delivered_counts_content_events_not_the_role_chunk() -> None:
    sent = [
        role("c1") + ev("c1", {"content": " the"}),
        ev("c1", {"content": " river"}) + ev("c1", {"content": ""}),
    ]
    done = delivered(sent)
    assert done.text == " the river"
    assert done.tokens == 3  # a token may decode to no text (vLLM still sends its event)
    assert (done.chunk_id, done.created, done.finished) == ("c1", 1, False)
    assert delivered([role("c1") + ev("c1", {"content": " x"}, "length")]).finished


def test_the_continuation_is_the_text_and_the_budget_left() -> None:
    done = delivered([role("c1") + ev("c1", {"content": " a"}) + ev("c1", {"content": " b"})])
    budget = Budget(40, 6)
    assert continuation(budget, done) == Continuation(Budget(40, 4), " a b")
    assert budget == Budget(40, 6)  # the original is not touched
    assert continuation(Budget(), done) == Continuation(Budget(), " a b")  # unbounded (an older gateway)


def test_nothing_to_continue() -> None:
    two = delivered([role("c1") + ev("c1", {"content": " a"}) + ev("c1", {"content": " b"})])
    assert continuation(Budget(40, 2), two) is None  # every token was delivered
    finished = delivered([role("c1") + ev("c1", {"content": " a"}, "stop")])
    assert continuation(Budget(40, 6), finished) is None
    # Only the role chunk went out: the same request again (its role chunk is dropped by the splice).
    assert continuation(Budget(40, 6), delivered([role("c1")])) == Continuation(Budget(40, 6), None)


def test_splice_drops_the_second_role_chunk_and_keeps_the_stream_id() -> None:
    first = [role("c1") + ev("c1", {"content": " a"}), ev("c1", {"content": " b"})]
    splice = Splice(delivered(first), first_prompt=None)
    out = splice.chunks(role("c2", created=9) + ev("c2", {"content": " c"}, created=9))
    out += splice.chunks(ev("c2", {"content": " d"}, "length", created=9))
    got = payloads(out)
    assert [p["choices"][0]["delta"] for p in got] == [{"content": " c"}, {"content": " d"}]
    assert {(p["id"], p["created"]) for p in got} == {("c1", 1)}
    assert got[-1]["choices"][0]["finish_reason"] == "length"
    # The seam: the client's whole text, nothing lost or repeated.
    text = [p["choices"][0]["delta"].get("content", "") for p in payloads("".join(first).encode()) + got]
    assert "".join(text) == " a b c d"
    # A later chunk carrying a role-like empty delta is content (only the first role chunk goes).
    assert payloads(splice.chunks(ev("c2", {"role": "assistant", "content": ""})))


def test_usage_event_counts_what_the_client_received() -> None:
    first = [role("c1") + ev("c1", {"content": " a"}) + ev("c1", {"content": " b"})]
    raw = chunk_payload("c2", "m", 9, [], {"usage": usage_block(14, 3)}).decode()
    unknown = payloads(Splice(delivered(first), first_prompt=None).usage_event(raw, 14, 3))[0]
    assert unknown["usage"] == {"prompt_tokens": 12, "total_tokens": 17, "completion_tokens": 5}
    assert (unknown["id"], unknown["created"], unknown["choices"]) == ("c1", 1, [])
    known = payloads(Splice(delivered(first), first_prompt=11).usage_event(raw, 14, 3))[0]
    assert known["usage"]["prompt_tokens"] == 11


@pytest.mark.parametrize(
    ("second_prompt", "second_completion", "delivered_tokens", "first_prompt", "expected"),
    [
        (14, 3, 2, None, (12, 5, 14)),  # prompt unknown: the re-prefill minus the delivered text
        (14, 3, 2, 11, (11, 5, 14)),  # the first node's own count wins
        (1, 0, 5, None, (0, 5, 1)),  # never negative
    ],
)
def test_billing_rule(
    second_prompt: int,
    second_completion: int,
    delivered_tokens: int,
    first_prompt: int | None,
    expected: tuple[int, int, int],
) -> None:
    assert billed(second_prompt, second_completion, delivered_tokens, first_prompt) == expected


@pytest.mark.parametrize(
    ("extra", "ok"),
    [
        ({}, True),
        ({"n": 1}, True),
        ({"n": 2}, False),
        ({"logprobs": True}, False),
        ({"top_logprobs": 2}, False),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, False),
        ({"stream": False}, True),  # the engine streams every request (the gateway collects)
        ({"messages": None, "prompt": "x"}, False),
    ],
)
def test_which_requests_resume(extra: dict[str, Any], ok: bool) -> None:
    assert resumable({**BODY, **extra}) is ok


def test_resume_is_per_model() -> None:
    dreq = DispatchRequest(request_id="r", team_id=1, model="m", body=BODY)
    assert can_resume(dreq, None)
    assert can_resume(dreq, {"m"})
    assert not can_resume(dreq, {"other"})
    assert not can_resume(dreq.model_copy(update={"n": 2}), None)  # the budget's n


COMPLETION: dict[str, Any] = {"model": "m", "prompt": "Once upon", "stream": True, "max_tokens": 6}


@pytest.mark.parametrize(
    ("endpoint", "extra", "ok"),
    [
        ("completions", {}, True),
        ("completions", {"prompt": [1, 2, 3]}, False),  # token ids: no text to continue
        ("completions", {"echo": True}, False),  # the prompt again on the second node
        ("completions", {"suffix": "end"}, False),
        ("completions", {"n": 2}, False),
        ("completions", {"logprobs": 2}, False),
        ("embeddings", {"input": "x"}, False),  # one answer: nothing streams
        ("chat", {}, False),  # a chat body has messages
    ],
)
def test_which_completions_resume(endpoint: str, extra: dict[str, Any], ok: bool) -> None:
    assert resumable({**COMPLETION, **extra}, endpoint) is ok


def text_ev(chunk_id: str, text: str, finish: str | None = None) -> str:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    payload = {"id": chunk_id, "object": "text_completion", "created": 1, "model": "m", "choices": [choice]}
    return sse_event(json.dumps(payload).encode()).decode()


def test_a_completions_delivered_text_is_what_continues() -> None:
    done = delivered([text_ev("cmpl-1", " a") + text_ev("cmpl-1", " time")])
    assert (done.text, done.tokens, done.chunk_id, done.finished) == (" a time", 2, "cmpl-1", False)
    assert continuation(Budget(20, 6), done) == Continuation(Budget(20, 4), " a time")
    assert delivered([text_ev("cmpl-1", ".", "stop")]).finished
    dreq = DispatchRequest(request_id="r", team_id=1, model="m", body=COMPLETION, endpoint="completions")
    assert can_resume(dreq, {"m"})
    assert not can_resume(dreq.model_copy(update={"endpoint": "embeddings"}), None)
