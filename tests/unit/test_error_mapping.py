"""The one error mapping (`apps.core.errors.http_error`) and the store boundary (`apps.core.stores`)."""

from __future__ import annotations

import psycopg
import pytest
import redis.exceptions

from apps.core.errors import (
    DuplicateRequestId,
    ForwardedError,
    InvalidRequest,
    RateLimited,
    StoreUnavailable,
    http_error,
    internal_token_rejected,
    retry_after_header,
)
from apps.core.protocol.dispatch import InternalToken, bearer
from apps.core.stores import postgres_boundary, redis_boundary


def test_retry_after_is_whole_seconds_and_at_least_one() -> None:
    assert [retry_after_header(s) for s in (0.0, 0.4, 1.6, 30)] == ["1", "1", "2", "30"]


def test_http_error_gives_status_headers_and_the_openai_body() -> None:
    status, headers, body = http_error(
        RateLimited("slow down", code="rpm", retry_after=2.4), {"x-request-id": "r1"}
    )
    assert status == 429
    assert headers == {"x-request-id": "r1", "Retry-After": "2"}
    assert body == {
        "error": {"message": "slow down", "type": "rate_limit_error", "param": None, "code": "rpm"}
    }
    assert http_error(InvalidRequest("bad", param="model"))[1] == {}


def test_a_forwarded_error_keeps_its_status_without_touching_the_class() -> None:
    err = ForwardedError(
        "no such model", status=404, error_type="invalid_request_error", code="invalid_request"
    )
    assert http_error(err)[0] == 404
    assert InvalidRequest("x").status == 400  # nothing mutated on a class or a shared instance
    assert http_error(internal_token_rejected())[:1] == (401,)
    assert internal_token_rejected().envelope()["error"] == {
        "message": "invalid internal token",
        "type": "authentication_error",
        "param": None,
        "code": None,
    }


def test_the_internal_token_check() -> None:
    token = InternalToken("it-secret")
    assert token.accepts(bearer("it-secret"))
    assert not token.accepts("Bearer it-secreT")
    assert not token.accepts(None)
    assert not InternalToken("").accepts("Bearer ")  # no token configured: nothing is accepted


async def test_storage_exceptions_are_translated_at_the_store_boundary() -> None:
    class Store:
        @postgres_boundary(unique_violation=DuplicateRequestId)
        async def reserve(self, exc: Exception) -> None:
            raise exc

        @postgres_boundary()
        async def cancel(self, exc: Exception) -> None:
            raise exc

        @redis_boundary
        async def admit(self, exc: Exception) -> None:
            raise exc

    store = Store()
    with pytest.raises(DuplicateRequestId) as dup:
        await store.reserve(psycopg.errors.UniqueViolation("dup"))
    assert dup.value.param == "x-request-id"
    with pytest.raises(StoreUnavailable) as pg:
        await store.reserve(psycopg.OperationalError("down"))
    assert pg.value.store == "postgres"
    assert pg.value.status == 503
    with pytest.raises(StoreUnavailable):
        await store.cancel(psycopg.errors.UniqueViolation("dup"))
    for exc in (redis.exceptions.ConnectionError("down"), OSError("reset")):
        with pytest.raises(StoreUnavailable) as rd:
            await store.admit(exc)
        assert rd.value.store == "redis"
    with pytest.raises(ValueError, match="not a store error"):
        await store.admit(ValueError("not a store error"))
