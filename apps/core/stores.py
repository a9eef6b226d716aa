"""The store boundary: storage exceptions become `apps.core.errors` exceptions here, once.

A store's method is decorated with the store it talks to; callers (the chat handler, the
settle path) see `StoreUnavailable` (any psycopg error, or any redis error or socket error) or the
error the store names for a unique-key violation, never a driver's exception.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

import psycopg
import redis.exceptions

from apps.core.errors import LlmfleetError, StoreUnavailable

P = ParamSpec("P")
T = TypeVar("T")


def postgres_boundary(
    *, unique_violation: Callable[[], LlmfleetError] | None = None
) -> Callable[[Callable[P, Coroutine[Any, Any, T]]], Callable[P, Coroutine[Any, Any, T]]]:
    """psycopg errors -> `StoreUnavailable("postgres")`; a unique violation -> `unique_violation()`
    when given (else it is a store failure like any other)."""

    def wrap(method: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        @functools.wraps(method)
        async def run(*args: P.args, **kwargs: P.kwargs) -> T:
            try:
                return await method(*args, **kwargs)
            except psycopg.Error as exc:
                if unique_violation is not None and isinstance(exc, psycopg.errors.UniqueViolation):
                    raise unique_violation() from None
                raise StoreUnavailable("postgres") from exc

        return run

    return wrap


def redis_boundary(method: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
    """redis errors and socket errors -> `StoreUnavailable("redis")`."""

    @functools.wraps(method)
    async def run(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await method(*args, **kwargs)
        except (redis.exceptions.RedisError, OSError) as exc:
            raise StoreUnavailable("redis") from exc

    return run
