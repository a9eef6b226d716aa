"""A cache entry (`apps.core.respcache.entry`): captured from a miss's stream, sealed with the team's key
(`apps.core.respcache.sealing`), replayed in the same SSE shape or folded like a miss's answer."""

from __future__ import annotations

import json

import pytest

from apps.core.protocol.assemble import assemble_completion
from apps.core.protocol.openai import SseSplitter
from apps.core.respcache.entry import MAX_ANSWER_BYTES, CapturedAnswer
from apps.core.respcache.sealing import TeamKey, Unsealable, new_salt

pytestmark = pytest.mark.timeout(10)


def chunk(content: str | None, finish: str | None = None, role: str | None = None) -> bytes:
    delta = {k: v for k, v in {"role": role, "content": content}.items() if v is not None}
    return json.dumps(
        {
            "id": "chatcmpl-engine",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
    ).encode()


USAGE = b'{"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9}}'
STREAM = [chunk("", role="assistant"), chunk("Hel"), chunk("lo", "stop"), USAGE, b"[DONE]"]


def captured(payloads: list[bytes]) -> CapturedAnswer:
    capture = CapturedAnswer("chat")
    for p in payloads:
        capture.add(p)
    return capture


def test_a_whole_answer_replays_in_its_shape_with_a_new_id() -> None:
    answer = captured(STREAM).storable()
    assert answer is not None
    assert (answer.prompt_tokens, answer.completion_tokens) == (7, 2)
    events = [
        p for e in answer.stream("chatcmpl-new", with_usage=True, created=5) for p in SseSplitter().feed(e)
    ]
    assert events[-1] == b"[DONE]"
    bodies = [json.loads(e) for e in events[:-1]]
    assert [b["choices"] for b in bodies[:3]] == [json.loads(p)["choices"] for p in STREAM[:3]]
    assert {b["id"] for b in bodies} == {"chatcmpl-new"}
    assert {b["created"] for b in bodies} == {5}
    assert bodies[-1]["usage"] == {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
    without = list(answer.stream("chatcmpl-new", with_usage=False))
    assert len(without) == 4  # three chunks and [DONE]: no usage chunk unless asked
    body = answer.body("chatcmpl-new", created=5)
    folded = assemble_completion(STREAM[:3])
    assert body["choices"] == folded["choices"]
    assert body["choices"][0]["message"]["content"] == "Hello"
    assert body["id"] == "chatcmpl-new"
    assert body["usage"]["total_tokens"] == 9


@pytest.mark.parametrize(
    "payloads",
    [
        STREAM[:-1],  # no [DONE]: the stream did not finish
        [s for s in STREAM if s is not USAGE],  # no usage: no token counts to bill a hit with
        [*STREAM[:2], b'{"error":{"message":"boom"}}', b"[DONE]"],
        [USAGE, b"[DONE]"],  # nothing but usage
    ],
)
def test_an_incomplete_answer_is_never_stored(payloads: list[bytes]) -> None:
    assert captured(payloads).storable() is None


def test_an_answer_over_the_bound_is_dropped_not_kept() -> None:
    capture = CapturedAnswer("chat")
    big = chunk("x" * (MAX_ANSWER_BYTES // 2))
    for p in [big, big, big, USAGE, b"[DONE]"]:
        capture.add(p)
    assert capture.storable() is None
    assert capture.payloads == []  # nothing held after the bound


def test_the_usage_chunk_is_reported_to_the_caller() -> None:
    capture = CapturedAnswer("chat")
    assert capture.add(chunk("a")) is True
    assert capture.add(USAGE) is False  # the caller passes it on only if its client asked for usage


def test_a_sealed_answer_opens_only_for_its_team_model_revision_and_key() -> None:
    answer = captured(STREAM).storable()
    assert answer is not None
    secret, salt = b"s" * 32, new_salt()
    key = TeamKey.derive(secret, 1, salt)
    sealed = key.seal(answer.pack(), "m", "r1", b"exact")
    assert b"Hel" not in sealed
    assert type(answer).unpack(key.open(sealed, "m", "r1", b"exact")) == answer
    for other in (
        (TeamKey.derive(secret, 2, salt), "m", "r1", b"exact"),  # another team, even with the same salt
        (TeamKey.derive(secret, 1, new_salt()), "m", "r1", b"exact"),  # the team's key after a purge
        (TeamKey.derive(b"t" * 32, 1, salt), "m", "r1", b"exact"),  # another gateway secret
        (key, "m2", "r1", b"exact"),
        (key, "m", "r2", b"exact"),
        (key, "m", "r1", b"other"),
    ):
        k, model, revision, exact = other
        with pytest.raises(Unsealable):
            k.open(sealed, model, revision, exact)
    assert key.hmac_key != TeamKey.derive(secret, 2, salt).hmac_key
