"""The response cache's request-path glue (`apps.gateway.caching`) with stand-in stores: the cache is
asked only for a team whose policy names the model, fails open (a store error is an uncached request,
counted), and a miss's answer is stored only when whole and from the revision looked up, in the
background, which shutdown waits for (`drain`)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from apps.core.errors import StoreUnavailable
from apps.core.identity.principal import Principal
from apps.core.quota.admission import Limits
from apps.core.respcache.policy import CachePolicy
from apps.core.respcache.sealing import TeamKey
from apps.core.respcache.store import Scope
from apps.core.spec import load_spec
from apps.gateway.caching import CACHE_HEADER, ResponseCaching
from apps.gateway.exchange import Exchange
from apps.gateway.settings import GatewaySettings
from apps.gateway.validate import validate_chat

pytestmark = pytest.mark.timeout(10)

MODEL = "llama-3.1-8b-instruct"
PRINCIPAL = Principal("api_key", "7", 3, "t", 7, (), Limits())
KEY = TeamKey.derive(b"s" * 32, 3, b"x" * 32)


@dataclass
class Policies:
    policy: CachePolicy | None
    fail: bool = False

    async def policy_of(self, team_id: int) -> CachePolicy | None:
        if self.fail:
            raise StoreUnavailable("postgres")
        return self.policy


@dataclass
class Store:
    puts: list[Scope] = field(default_factory=list)
    gate: asyncio.Event = field(default_factory=asyncio.Event)

    async def stable_revision(self, model: str) -> str:
        return "r1"

    async def key(self, team_id: int) -> TeamKey:
        return KEY

    async def exact(self, scope: Scope, key: TeamKey, exact: bytes) -> None:
        return None

    async def semantic_available(self) -> bool:
        return False

    async def put(self, scope: Scope, *args: Any, **kwargs: Any) -> None:
        await self.gate.wait()
        self.puts.append(scope)


def caching(
    policy: CachePolicy | None, *, fail: bool = False
) -> tuple[ResponseCaching, Store, CollectorRegistry]:
    policies, store, registry = Policies(policy, fail), Store(), CollectorRegistry()
    policies_api = SimpleNamespace(policy=policies.policy_of)
    deps = SimpleNamespace(
        spec=load_spec("dev"), cache_policies=policies_api, cache_store=store, ledger=None, registry=registry
    )
    return ResponseCaching(GatewaySettings(secret_key="k"), deps), store, registry  # type: ignore[arg-type]


def request(**extra: Any) -> Any:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": 0, **extra}
    return validate_chat(body, load_spec("dev"))


def counted(registry: CollectorRegistry, result: str) -> float:
    labels = {"team": "3", "model": MODEL, "result": result}
    return registry.get_sample_value("llmfleet_gateway_cache_requests_total", labels) or 0.0


ON = CachePolicy.model_validate({"models": {MODEL: {}}})


async def test_the_cache_is_asked_only_where_the_teams_policy_names_the_model() -> None:
    cache, _, _ = caching(None)
    ex = Exchange("t3/a", 0.0)
    assert await cache.plan(request(), PRINCIPAL, ex) is None
    assert CACHE_HEADER not in ex.headers
    other_model = CachePolicy.model_validate({"models": {"qwen2.5-32b-instruct": {}}})
    cache, _, _ = caching(other_model)
    assert await cache.plan(request(), PRINCIPAL, ex) is None
    cache, _, registry = caching(ON)
    assert await cache.plan(request(n=2), PRINCIPAL, ex) is None
    assert ex.headers[CACHE_HEADER] == "bypass"
    assert counted(registry, "bypass") == 1
    turn = await cache.plan(request(), PRINCIPAL, ex)
    assert turn is not None
    assert turn.scope == Scope(3, MODEL, "r1")


async def test_a_store_that_fails_is_an_uncached_request_counted_as_error() -> None:
    cache, _, registry = caching(ON, fail=True)
    ex = Exchange("t3/a", 0.0)
    assert await cache.plan(request(), PRINCIPAL, ex) is None
    assert counted(registry, "error") == 1
    assert CACHE_HEADER not in ex.headers


def payload(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()  # compact, as vLLM writes its chunks


CHUNK = payload(
    {
        "id": "x",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": MODEL,
        "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}],
    }
)
USAGE = payload(
    {
        "id": "x",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": MODEL,
        "choices": [],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
)


async def test_a_whole_answer_from_the_looked_up_revision_is_stored_in_the_background() -> None:
    cache, store, registry = caching(ON)
    turn = await cache.plan(request(), PRINCIPAL, Exchange("t3/a", 0.0))
    assert turn is not None
    cache.capture(turn, SimpleNamespace(status=200, headers={}), False)  # type: ignore[arg-type]
    assert turn.capture is not None
    for p in (CHUNK, USAGE, b"[DONE]"):
        turn.capture.add(p)
    cache.remember(turn, "3", "r2", "done")  # another revision answered: not stored
    cache.remember(turn, "3", "r1", "timeout")  # did not finish: not stored
    cache.remember(turn, "3", "r1", "done")
    skipped = registry.get_sample_value(
        "llmfleet_gateway_cache_writes_total", {"model": MODEL, "outcome": "skipped"}
    )
    assert skipped == 2
    assert store.puts == []  # the write waits for the store (held by its gate)
    draining = asyncio.ensure_future(cache.drain())
    await asyncio.sleep(0)
    assert not draining.done()
    store.gate.set()
    await draining
    assert store.puts == [Scope(3, MODEL, "r1")]
    assert counted(registry, "miss") == 3


async def test_the_janitor_deletes_expired_entries_a_batch_at_a_time_until_a_short_batch() -> None:
    cache, store, _ = caching(ON)
    batches = [1000, 1000, 3]
    calls: list[int] = []
    third = asyncio.Event()

    async def expire(limit: int = 1000) -> int:
        calls.append(limit)
        if len(calls) == 3:
            third.set()
        return batches[len(calls) - 1] if len(calls) <= len(batches) else 0

    store.expire = expire  # type: ignore[attr-defined]
    janitor = asyncio.ensure_future(cache.janitor())
    await third.wait()
    await asyncio.sleep(0)  # one loop turn: a fourth batch would start now if the third had been full
    janitor.cancel()
    await asyncio.gather(janitor, return_exceptions=True)
    assert calls == [1000, 1000, 1000]  # two full batches, then a short one: the next comes in a minute
