"""The gateway's output screening (apps/gateway/screening.py): an answer's text passes the team's
output checks as it streams, redacted across any chunk boundary, ended by a block with the
`guardrail_blocked` event; usage and error events pass unchanged. The upstream is scripted: the SSE
bytes an orchestrator writes, cut where the test says."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from apps.core.guardrails.decisions import Decision, GuardrailBlocked
from apps.core.guardrails.metrics import GuardrailMetrics
from apps.core.guardrails.policy import compile_policy, parse_policy
from apps.core.protocol.openai import SSE_DONE, SseSplitter, sse_event
from apps.gateway.exchange import Exchange
from apps.gateway.screening import ScreenedUpstream, Screening

pytestmark = pytest.mark.timeout(30)

SSN = "123-45-6789"
ANSWER = f"Your SSN is {SSN}, call us."
REDACTED = "Your SSN is [REDACTED:SSN], call us."
USAGE = b'{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":9,"total_tokens":12}}'


class Scripted:
    """An upstream that yields the given reads and records how many were taken."""

    def __init__(self, reads: list[bytes]) -> None:
        self.reads = reads
        self.taken = 0
        self.status = 200
        self.headers: Mapping[str, str] = {}
        self.closed = False

    async def chunks(self) -> AsyncIterator[bytes]:
        for data in self.reads:
            self.taken += 1
            yield data

    async def read_body(self) -> bytes:
        return b""

    async def aclose(self) -> None:
        self.closed = True


def chat_event(text: str, finish: str | None = None, index: int = 0) -> bytes:
    choice = {"index": index, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}
    chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice]}
    return sse_event(json.dumps(chunk).encode())


def text_event(text: str, finish: str | None = None) -> bytes:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    chunk = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m", "choices": [choice]}
    return sse_event(json.dumps(chunk).encode())


def policy(output: list[dict[str, str]]) -> Any:
    return compile_policy(parse_policy({"output": output}))


async def screened(
    reads: list[bytes], checks: list[dict[str, str]], endpoint: str = "chat"
) -> tuple[list[dict[str, Any] | str], ScreenedUpstream, list[Decision]]:
    counted: list[Decision] = []
    upstream = ScreenedUpstream(Scripted(reads), tuple(policy(checks).output), endpoint, counted.extend)
    raw = b"".join([data async for data in upstream.chunks()])
    events: list[dict[str, Any] | str] = [
        p.decode() if p == b"[DONE]" else json.loads(p) for p in SseSplitter().feed(raw)
    ]
    return events, upstream, counted


def texts(events: list[dict[str, Any] | str], key: str = "content") -> str:
    out = []
    for e in events:
        if isinstance(e, dict):
            for c in e.get("choices") or []:
                holder = c.get("delta", c) if key == "content" else c
                out.append(holder.get(key) or "")
    return "".join(out)


@pytest.mark.parametrize("cut", range(1, len(ANSWER)))
async def test_a_redaction_holds_across_every_chunk_boundary(cut: int) -> None:
    reads = [chat_event(ANSWER[:cut]), chat_event(ANSWER[cut:], "stop") + sse_event(USAGE) + SSE_DONE]
    events, _, counted = await screened(reads, [{"detector": "ssn", "action": "redact"}])
    assert texts(events) == REDACTED
    assert SSN not in json.dumps(events)
    assert [d.action for d in counted] == ["redact"]
    assert events[-2] == json.loads(USAGE)  # the usage event passes unchanged
    assert events[-1] == "[DONE]"


async def test_a_completion_text_is_screened_too_and_held_text_flushes_before_done() -> None:
    reads = [text_event("SSN 123-45-"), text_event("6789"), SSE_DONE]  # no finish_reason seen
    events, _, _ = await screened(reads, [{"detector": "ssn", "action": "redact"}], "completions")
    assert texts(events, "text") == "SSN [REDACTED:SSN]"
    assert events[-1] == "[DONE]"


async def test_a_block_ends_the_stream_with_the_error_and_leaves_the_upstream_unread() -> None:
    reads = [chat_event("fine so far. SSN "), chat_event(SSN + " more"), chat_event(" never"), SSE_DONE]
    events, upstream, counted = await screened(reads, [{"detector": "ssn", "action": "block"}])
    error = events[-2]
    assert isinstance(error, dict)
    assert error["error"]["code"] == "guardrail_blocked"
    assert error["error"]["param"] == "choices.0"
    assert SSN not in json.dumps(error)
    assert events[-1] == "[DONE]"
    assert SSN not in texts(events)
    assert "never" not in texts(events)
    assert upstream.blocked is not None
    assert [d.action for d in counted] == ["block"]
    assert upstream._inner.taken == 2  # type: ignore[attr-defined]  # nothing read after the block


async def test_each_choice_has_its_own_scanner() -> None:
    reads = [
        chat_event("a 123-45-", index=0) + chat_event("b 234-56-", index=1),
        chat_event("6789", "stop", index=0) + chat_event("7890", "stop", index=1) + SSE_DONE,
    ]
    events, _, _ = await screened(reads, [{"detector": "ssn", "action": "redact"}])
    by_choice: dict[int, str] = {}
    for e in events:
        if isinstance(e, dict):
            for c in e["choices"]:
                by_choice[c["index"]] = by_choice.get(c["index"], "") + (c["delta"].get("content") or "")
    assert by_choice == {0: "a [REDACTED:SSN]", 1: "b [REDACTED:SSN]"}


async def test_without_output_checks_the_upstream_is_the_relays_own() -> None:
    screening = Screening(None, GuardrailMetrics(CollectorRegistry()))
    upstream = Scripted([SSE_DONE])
    ex = Exchange("r1", 0.0)
    assert screening.screen_output(upstream, None, "chat", 1, ex) is upstream
    only_input = compile_policy(parse_policy({"input": [{"detector": "ssn", "action": "block"}]}))
    assert screening.screen_output(upstream, only_input, "chat", 1, ex) is upstream
    out = policy([{"detector": "ssn", "action": "redact"}])
    assert screening.screen_output(upstream, out, "embeddings", 1, ex) is upstream
    assert isinstance(screening.screen_output(upstream, out, "chat", 1, ex), ScreenedUpstream)


async def test_every_decision_goes_to_the_metric_at_once_and_to_the_request_for_the_console() -> None:
    registry = CollectorRegistry()
    screening = Screening(None, GuardrailMetrics(registry))
    checks = {
        "input": [{"detector": "email", "action": "redact"}, {"detector": "ssn", "action": "block"}],
        "output": [{"detector": "ssn", "action": "redact"}],
    }
    compiled = compile_policy(parse_policy(checks))
    ex = Exchange("r1", 0.0)
    body = {"messages": [{"role": "user", "content": "write to a@example.com or b@example.com"}]}
    sent = screening.screen_input(compiled, "chat", body, 7, ex)
    assert sent["messages"][0]["content"] == "write to [REDACTED:EMAIL] or [REDACTED:EMAIL]"
    with pytest.raises(GuardrailBlocked):
        screening.screen_input(compiled, "chat", {"messages": [{"role": "user", "content": SSN}]}, 7, ex)
    upstream = screening.screen_output(
        Scripted([chat_event(ANSWER, "stop"), SSE_DONE]), compiled, "chat", 7, ex
    )
    _ = [data async for data in upstream.chunks()]
    assert [(d.direction, d.check, d.action) for d in ex.decisions] == [
        ("input", "email", "redact"),
        ("input", "email", "redact"),
        ("input", "ssn", "block"),
        ("output", "ssn", "redact"),
    ]
    assert all(SSN not in d.field and "@" not in d.field for d in ex.decisions)  # where, never what

    def value(direction: str, check: str, action: str) -> float | None:
        labels = {"team": "7", "direction": direction, "check": check, "action": action}
        return registry.get_sample_value("llmfleet_gateway_guardrail_decisions_total", labels)

    assert (value("input", "email", "redact"), value("input", "ssn", "block")) == (2, 1)
    assert value("output", "ssn", "redact") == 1
