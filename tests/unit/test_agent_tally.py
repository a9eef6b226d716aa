"""The agent's token tally: the engine's running usage read from chunk bytes (vLLM 0.32's
`continuous_usage_stats`), and the bytes the client gets without it."""

from __future__ import annotations

import json

from apps.agent.tally import TokenTally

# Captured from vLLM 0.32.0 (tiny model, `include_usage` + `continuous_usage_stats`).
ROLE = (
    b'{"id":"chatcmpl-b32ed94c35934d62","object":"chat.completion.chunk","created":1796140032,"model":"tiny",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],'
    b'"usage":{"prompt_tokens":8,"total_tokens":8,"completion_tokens":0,"completion_tokens_details":null},'
    b'"prompt_token_ids":null,"prompt_text":null}'
)
TOKEN = (
    b'{"id":"chatcmpl-b32ed94c35934d62","object":"chat.completion.chunk","created":1796140032,"model":"tiny",'
    b'"choices":[{"index":0,"delta":{"content":"fun"},"logprobs":null,"finish_reason":null,"token_ids":null}],'
    b'"usage":{"prompt_tokens":8,"total_tokens":10,"completion_tokens":2,"completion_tokens_details":null}}'
)
# The same events as vLLM 0.32 sends them without `continuous_usage_stats`.
ROLE_PLAIN = (
    b'{"id":"chatcmpl-b32ed94c35934d62","object":"chat.completion.chunk","created":1796140032,"model":"tiny",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],'
    b'"prompt_token_ids":null,"prompt_text":null}'
)
TOKEN_PLAIN = (
    b'{"id":"chatcmpl-b32ed94c35934d62","object":"chat.completion.chunk","created":1796140032,"model":"tiny",'
    b'"choices":[{"index":0,"delta":{"content":"fun"},"logprobs":null,"finish_reason":null,"token_ids":null}]}'
)


def _choice_chunk(index: int, completion: int, content: str = "x", details: str = "null") -> bytes:
    return (
        b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"tiny","choices":[{"index":'
        + str(index).encode()
        + b',"delta":{"content":'
        + json.dumps(content).encode()
        + b'},"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":8,"total_tokens":'
        + str(8 + completion).encode()
        + b',"completion_tokens":'
        + str(completion).encode()
        + b',"completion_tokens_details":'
        + details.encode()
        + b"}}"
    )


def test_the_usage_the_client_did_not_ask_for_is_cut_out_to_vllms_plain_bytes() -> None:
    tally = TokenTally()
    assert tally.take(ROLE) == ROLE_PLAIN
    assert (tally.seen, tally.completion_tokens, tally.prompt_tokens) == (True, 0, 8)
    assert tally.take(TOKEN) == TOKEN_PLAIN
    assert (tally.completion_tokens, tally.prompt_tokens) == (2, 8)


def test_a_merged_chunk_counts_every_token_it_stands_for() -> None:
    tally = TokenTally()
    tally.take(_choice_chunk(0, 1))
    tally.take(_choice_chunk(0, 7))  # vLLM fell behind: six tokens in one chunk
    assert tally.completion_tokens == 7  # counting chunks says 2


def test_running_counts_are_per_choice_and_summed() -> None:
    tally = TokenTally(choices=2)
    for completion in (1, 2, 3):
        tally.take(_choice_chunk(0, completion))
        tally.take(_choice_chunk(1, completion))
    tally.take(_choice_chunk(1, 4))
    assert tally.completion_tokens == 3 + 4  # as the final usage sums the choices
    single = TokenTally()  # n = 1: the index is not even read
    single.take(_choice_chunk(0, 5))
    assert single.completion_tokens == 5


def test_kept_for_a_client_that_asked_for_it() -> None:
    tally = TokenTally(keep_chunk_usage=True)
    assert tally.take(TOKEN) == TOKEN
    assert tally.completion_tokens == 2


def test_a_nested_usage_object_is_cut_out_whole() -> None:
    tally = TokenTally()
    out = tally.take(_choice_chunk(0, 5, details='{"reasoning_tokens":2}'))
    assert b"usage" not in out
    assert b"reasoning_tokens" not in out
    assert json.loads(out)["choices"][0]["delta"] == {"content": "x"}
    assert tally.completion_tokens == 5


def test_text_that_looks_like_usage_is_text() -> None:
    tally = TokenTally()
    tricky = ',"usage":{"completion_tokens":999} "choices":[{"index":5'
    out = tally.take(_choice_chunk(0, 3, content=tricky))
    assert json.loads(out)["choices"][0]["delta"]["content"] == tricky
    assert "usage" not in json.loads(out)
    assert tally.completion_tokens == 3


def test_events_without_usage_pass_untouched_and_leave_the_tally_empty() -> None:
    tally = TokenTally()
    assert tally.take(TOKEN_PLAIN) == TOKEN_PLAIN
    assert tally.take(b'{"error"') == b'{"error"'
    assert (tally.seen, tally.completion_tokens, tally.prompt_tokens) == (False, 0, None)
