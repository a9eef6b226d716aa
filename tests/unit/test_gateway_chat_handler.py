"""The chat handler with every store faked (`apps.gateway.ports` Protocols): no PostgreSQL, Redis
or server. Errors come from the one mapping (`apps.core.errors.http_error`), storage failures are
the stores' `StoreUnavailable`, and a refused request gives back what it took."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import psycopg
import pytest

from apps.core.errors import DuplicateRequestId, LlmfleetError, StoreUnavailable
from apps.core.ledger.api import Reservation, SettleOutcome, SettleResult
from apps.core.protocol.dispatch import DispatchRequest
from apps.core.protocol.openai import SSE_DONE, sse_event
from apps.core.protocol.vllm import chunk_payload, delta_choice
from apps.core.quota.admission import Verdict
from apps.core.spec import load_spec
from apps.gateway.app import create_app
from apps.gateway.deps import GatewayDeps
from apps.gateway.settings import GatewaySettings
from tests.fakes.fake_node_admin import FakeNodeAdmin
from tests.fakes.fake_stores import FakeKeys, FakeQuota, FakeRefusals, FakeTeams, StaticHealth
from tests.fakes.static_resolver import StaticResolver

MODEL = "llama-3.1-8b-instruct"
KEY = "sk-test-chat"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@dataclass
class RefusingLedger:
    """The `Ledger` port as this handler uses it: reservations are recorded (or refused with
    `refusal`), settles and cancels only recorded. The ledger's own transitions are PgLedger's, tested on
    PostgreSQL (tests/integration/test_ledger_pg.py)."""

    refusal: LlmfleetError | None = None
    reserved: list[str] = field(default_factory=list)
    settle_calls: list[tuple[str, int, int]] = field(default_factory=list)
    cancel_calls: list[str] = field(default_factory=list)

    async def reserve(
        self,
        *,
        request_id: str,
        team_id: int,
        key_id: int | None,
        model: str,
        estimated_prompt_tokens: int,
        max_tokens: int,
        quota_subject: str | None = None,
    ) -> Reservation:
        if self.refusal is not None:
            raise self.refusal
        self.reserved.append(request_id)
        return Reservation(request_id, team_id, key_id, model, estimated_prompt_tokens + max_tokens)

    async def settle(
        self, request_id: str, prompt_tokens: int, completion_tokens: int, **_: object
    ) -> SettleResult:
        self.settle_calls.append((request_id, prompt_tokens, completion_tokens))
        return SettleResult(SettleOutcome.SETTLED, request_id)

    async def cancel(self, request_id: str) -> bool:
        self.cancel_calls.append(request_id)
        return request_id in self.reserved


@dataclass
class ScriptedUpstream:
    """One answer of `ScriptedDispatcher`: a role chunk, `tokens` content chunks `delay_s` apart, a
    finish chunk and [DONE]; or, with a status other than 200, the error body."""

    owner: ScriptedDispatcher
    request: DispatchRequest
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status != 200:
            self.headers = {"retry-after": "3"}  # the orchestrator's hint on a refusal

    async def chunks(self) -> AsyncIterator[bytes]:
        rid, model = self.request.request_id, self.request.model
        yield sse_event(chunk_payload(rid, model, 0, [delta_choice({"role": "assistant", "content": ""})]))
        for i in range(self.owner.tokens):
            if self.owner.delay_s:
                await asyncio.sleep(self.owner.delay_s)  # the pace of a decoding engine
            yield sse_event(chunk_payload(rid, model, 0, [delta_choice({"content": f"t{i} "})]))
        yield sse_event(chunk_payload(rid, model, 0, [delta_choice({}, "stop")]))
        yield SSE_DONE

    async def read_body(self) -> bytes:
        return json.dumps(self.owner.error).encode()

    async def aclose(self) -> None:
        self.owner.closed += 1


@dataclass
class ScriptedDispatcher:
    """The `Dispatcher` port scripted for the handler's unit tests: it records each request and answers
    with `status` (and `error`) or a stream of `tokens` tokens. Settling is the orchestrator's, not
    this port's: the gateway's tests against the real platform cover it (tests/gateway_env.py)."""

    tokens: int = 3
    delay_s: float = 0.0
    status: int = 200
    error: dict[str, Any] = field(default_factory=dict)
    requests: list[DispatchRequest] = field(default_factory=list)
    closed: int = 0

    async def open(self, request: DispatchRequest) -> ScriptedUpstream:
        self.requests.append(request)
        return ScriptedUpstream(self, request, self.status)

    async def aclose(self) -> None:
        return None


@dataclass
class Env:
    client: httpx.AsyncClient
    ledger: RefusingLedger
    quota: FakeQuota
    dispatcher: ScriptedDispatcher
    refusals: FakeRefusals

    async def chat(self, **extra: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {KEY}"}
        return await self.client.post("/v1/chat/completions", json={**BODY, **extra}, headers=headers)


@contextlib.asynccontextmanager
async def gateway(
    settings: GatewaySettings, deps_args: dict[str, Any] | None = None, **dispatcher_args: Any
) -> AsyncIterator[Env]:
    """The gateway app on faked stores; `deps_args`: more `GatewayDeps` fields (guardrails...);
    `dispatcher_args` shape the scripted dispatcher's answers."""
    ledger = RefusingLedger()
    quota = FakeQuota()
    keys = FakeKeys()
    keys.add(KEY)
    dispatcher = ScriptedDispatcher(**dispatcher_args)
    refusals = FakeRefusals()
    deps = GatewayDeps(
        spec=load_spec("dev"),
        ledger=ledger,
        teams=FakeTeams(),
        keys=keys,
        quota=quota,
        dispatcher=dispatcher,
        nodes=FakeNodeAdmin(),
        health=StaticHealth(),
        resolver=StaticResolver(),
        refusals=refusals,
        **(deps_args or {}),
    )
    app = create_app(settings, deps)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        yield Env(client, ledger, quota, dispatcher, refusals)


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    async with gateway(GatewaySettings(secret_key="test-secret")) as e:
        yield e


async def test_a_request_is_answered_and_gives_back_its_slot(env: Env) -> None:
    resp = await env.chat()
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"] == "t0 t1 t2 "
    request_id = resp.headers["x-request-id"]
    assert env.quota.released == [request_id]
    assert env.quota.held == set()
    assert [r.request_id for r in env.dispatcher.requests] == [request_id]


async def test_a_quota_store_outage_fails_closed_with_retry_after_and_no_reservation_left(env: Env) -> None:
    env.quota.fail = StoreUnavailable("redis")
    resp = await env.chat()
    assert resp.status_code == 503
    assert resp.headers["retry-after"] == "5"
    assert resp.json()["error"]["type"] == "service_unavailable"
    assert env.dispatcher.requests == []
    request_id = resp.headers["x-request-id"]
    assert request_id in env.ledger.cancel_calls or request_id not in env.ledger.reserved


async def test_a_ledger_outage_is_a_503_and_the_slot_is_released(env: Env) -> None:
    env.ledger.refusal = StoreUnavailable("postgres")
    resp = await env.chat()
    assert resp.status_code == 503
    assert resp.json()["error"]["message"] == "The ledger is unavailable."
    assert env.quota.held == set()
    assert env.dispatcher.requests == []


async def test_a_duplicate_request_id_is_a_400_naming_the_header(env: Env) -> None:
    env.ledger.refusal = DuplicateRequestId()
    resp = await env.chat()
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert (error["param"], error["code"]) == ("x-request-id", "duplicate_request_id")
    assert env.quota.held == set()


async def test_a_rate_limited_request_gets_429_retry_after_and_its_reservation_cancelled(env: Env) -> None:
    env.quota.verdict = Verdict.RPM
    resp = await env.chat()
    assert resp.status_code == 429
    assert resp.headers["retry-after"] == "7"
    assert resp.json()["error"]["code"] == "rpm"
    request_id = resp.headers["x-request-id"]
    assert request_id in env.ledger.cancel_calls or request_id not in env.ledger.reserved
    assert env.dispatcher.requests == []


async def test_a_rate_limited_request_is_counted_for_its_team_and_key(env: Env) -> None:
    env.quota.verdict = Verdict.RPM
    resp = await env.chat()
    assert resp.status_code == 429
    assert env.refusals.counted == [(1, 1, 429, "rpm")]


async def test_a_ledger_outage_503_is_counted_a_quota_store_outage_is_not(env: Env) -> None:
    env.ledger.refusal = StoreUnavailable("postgres")
    assert (await env.chat()).status_code == 503
    env.ledger.refusal = None
    env.quota.fail = StoreUnavailable("redis")
    assert (await env.chat()).status_code == 503
    assert env.refusals.counted == [(1, 1, 503, "ledger_unavailable")]


async def test_a_failing_refusal_counter_changes_nothing_the_client_gets(env: Env) -> None:
    env.quota.verdict = Verdict.MAX_STREAMS
    env.refusals.fail = StoreUnavailable("redis")
    resp = await env.chat()
    assert resp.status_code == 429
    assert resp.json()["error"]["code"] == "max_streams"
    assert env.refusals.counted == []


async def test_a_successful_or_bad_request_is_not_a_refusal(env: Env) -> None:
    assert (await env.chat()).status_code == 200
    assert (await env.chat(max_tokens=-1)).status_code == 400
    assert env.refusals.counted == []


@pytest.mark.parametrize(
    ("status", "error", "expected"),
    [
        (
            429,
            ("the queue is full", "rate_limit_error", None, "queue_full"),
            (429, "rate_limit_error", None, "queue_full"),
        ),
        (
            503,
            ("no node within 30 s", "service_unavailable", None, "queue_timeout"),
            (503, "service_unavailable", None, "queue_timeout"),
        ),
        # The engine's own 400 (vLLM's context check): its param and type are the client's answer.
        (
            400,
            ("This model's maximum context length is 4096 tokens.", "BadRequestError", "messages", None),
            (400, "BadRequestError", "messages", "invalid_request"),
        ),
        (
            404,
            ("model 'x' is not served here", "invalid_request_error", "model", "model_not_found"),
            (404, "invalid_request_error", "model", "model_not_found"),
        ),
        (
            502,
            ("no first token within 60 s", "server_error", None, "timeout"),
            (502, "server_error", None, "timeout"),
        ),
    ],
)
async def test_the_orchestrators_error_reaches_the_client_with_its_code_and_param(
    env: Env, status: int, error: tuple[str, str, str | None, str | None], expected: tuple[Any, ...]
) -> None:
    message, error_type, param, code = error
    env.dispatcher.status = status
    env.dispatcher.error = {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    resp = await env.chat()
    got = resp.json()["error"]
    assert (resp.status_code, got["type"], got["param"], got["code"]) == expected
    assert got["message"] == message
    if status in (429, 503):
        assert resp.headers["retry-after"] == "3"  # the orchestrator's hint
    assert env.quota.held == set()


async def test_a_non_streaming_request_ends_at_the_maximum_request_time() -> None:
    # Chunks keep coming (no idle or first-token deadline trips): only the whole-request bound
    # ends it, with a 502, and its stream slot is given back.
    settings = GatewaySettings(secret_key="test-secret", max_request_s=0.3, first_token_s=30, idle_s=30)
    async with gateway(settings, tokens=10_000, delay_s=0.01) as e:
        resp = await e.chat(max_tokens=4096)
    quota, dispatcher = e.quota, e.dispatcher
    assert resp.status_code == 502, resp.text
    assert resp.json()["error"]["message"] == "upstream timed out"
    assert quota.held == set()
    assert dispatcher.closed == 1


async def test_a_value_the_database_refuses_is_a_400_not_a_500() -> None:
    """Issue 27 item 5's last line: a psycopg `DataError` (a NUL in text, a number past its column)
    that a route's own checks missed is the request's fault, a 400 in the OpenAI envelope (a 500
    made uvicorn drop the kept-alive connection)."""

    class RefusingKeys(FakeKeys):
        async def authenticate(self, secret: str) -> Any:
            raise psycopg.errors.CharacterNotInRepertoire("invalid byte sequence")

    deps = GatewayDeps(
        spec=load_spec("dev"),
        ledger=RefusingLedger(),
        teams=FakeTeams(),
        keys=RefusingKeys(),
        quota=FakeQuota(),
        dispatcher=ScriptedDispatcher(),
        nodes=FakeNodeAdmin(),
        health=StaticHealth(),
        resolver=StaticResolver(),
    )
    app = create_app(GatewaySettings(secret_key="test-secret"), deps)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        resp = await client.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
