"""A request's guardrail decisions counted for the console (apps/gateway/decision_counts.py), on the chat
handler with faked stores: one batch per request at its end, on every way out (answered, streamed,
blocked); no batch without a decision; a counter that fails or never answers changes nothing the client
gets (bounded by `guardrail_count_timeout_s`, counted as a Redis error)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from apps.core.errors import StoreUnavailable
from apps.core.guardrails.policy import CompiledPolicy, compile_policy, parse_policy
from apps.gateway.settings import GatewaySettings
from tests.fakes.fake_stores import FakeGuardrailCounts
from tests.unit.test_gateway_chat_handler import Env, gateway

pytestmark = pytest.mark.timeout(30)

POLICY = {
    "input": [{"detector": "email", "action": "redact"}, {"detector": "ssn", "action": "block"}],
    # The scripted answer is "t0 t1 t2 ": three matches, flagged (counted, the text unchanged).
    "output": [{"detector": "token", "action": "flag"}],
    "patterns": [{"name": "token", "pattern": "\\bt[0-9]\\b"}],
}
EMAIL = [{"role": "user", "content": "write to jane@example.com"}]
SSN = [{"role": "user", "content": "my SSN is 123-45-6789, write to jane@example.com"}]


class Policies:
    """The `GuardrailPolicies` port as the request path reads it: one compiled policy for every team."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self._compiled = compile_policy(parse_policy(doc))

    async def compiled(self, team_id: int) -> CompiledPolicy | None:
        return self._compiled


class Counted:
    def __init__(self, env: Env, counts: FakeGuardrailCounts, registry: CollectorRegistry) -> None:
        self.env, self.counts, self.registry = env, counts, registry

    def batches(self) -> list[list[tuple[str, str, str]]]:
        return [[(d.direction, d.check, d.action) for d in batch] for _, batch in self.counts.batches]

    def redis_errors(self) -> float:
        return self.registry.get_sample_value("llmfleet_gateway_redis_errors_total") or 0.0


@pytest.fixture
async def counted() -> AsyncIterator[Counted]:
    counts, registry = FakeGuardrailCounts(), CollectorRegistry()
    deps = {"guardrails": Policies(POLICY), "guardrail_counts": counts, "registry": registry}
    settings = GatewaySettings(secret_key="test-secret", guardrail_count_timeout_s=0.05)
    async with gateway(settings, deps) as env:
        yield Counted(env, counts, registry)


REDACTED_AND_FLAGGED = [
    ("input", "email", "redact"),
    ("output", "token", "flag"),
    ("output", "token", "flag"),
    ("output", "token", "flag"),
]


@pytest.mark.parametrize("stream", [False, True])
async def test_an_answered_request_is_one_batch_of_its_input_and_output_decisions(
    counted: Counted, stream: bool
) -> None:
    resp = await counted.env.chat(messages=EMAIL, stream=stream)
    assert resp.status_code == 200, resp.text
    if not stream:
        assert resp.json()["choices"][0]["message"]["content"] == "t0 t1 t2 "  # flagged: unchanged
    forwarded = counted.env.dispatcher.requests[0].body["messages"][0]["content"]
    assert forwarded == "write to [REDACTED:EMAIL]"
    assert counted.counts.batches[0][0] == 1  # the key's team
    assert counted.batches() == [REDACTED_AND_FLAGGED]
    assert all("@" not in d.field for _, batch in counted.counts.batches for d in batch)


async def test_a_blocked_request_is_counted_once(counted: Counted) -> None:
    resp = await counted.env.chat(messages=SSN)
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "guardrail_blocked"
    assert counted.env.dispatcher.requests == []
    assert counted.batches() == [[("input", "ssn", "block")]]  # the scan's decisions (it stops at a block)


async def test_a_request_without_a_decision_writes_nothing(counted: Counted) -> None:
    counted.env.dispatcher.tokens = 0  # an empty answer: nothing for the output check either
    assert (await counted.env.chat()).status_code == 200
    assert counted.counts.batches == []


@pytest.mark.parametrize("failure", ["fails", "hangs"])
async def test_a_counter_that_fails_or_never_answers_changes_nothing_the_client_gets(
    counted: Counted, failure: str
) -> None:
    if failure == "fails":
        counted.counts.fail = StoreUnavailable("redis")
    else:
        counted.counts.hang = True  # bounded by guardrail_count_timeout_s (0.05 s here)
    blocked = await counted.env.chat(messages=SSN)
    assert (blocked.status_code, blocked.json()["error"]["code"]) == (400, "guardrail_blocked")
    answered = await counted.env.chat(messages=EMAIL)
    assert answered.status_code == 200, answered.text
    assert answered.json()["choices"][0]["message"]["content"] == "t0 t1 t2 "
    assert counted.counts.batches == []
    assert counted.redis_errors() == 2  # one per request's batch, dropped
    assert counted.env.quota.held == set()


async def test_without_a_store_nothing_is_counted_and_the_request_is_answered() -> None:
    async with gateway(GatewaySettings(secret_key="test-secret"), {"guardrails": Policies(POLICY)}) as env:
        resp = await env.chat(messages=EMAIL)
        assert resp.status_code == 200, resp.text
