"""Small asyncio helpers: shielded bounded cleanup and "run until the first part ends"."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Coroutine
from typing import Any

from apps.orchestrator.logs import event


async def shielded(coro: Awaitable[Any], limit_s: float, what: str) -> None:
    """Run cleanup that must happen even if the caller is cancelled; bounded by `limit_s`.

    Errors are logged, not raised (cleanup must not mask the original outcome);
    cancellation of the caller is re-raised after the cleanup finished or timed out."""
    task = asyncio.ensure_future(asyncio.wait_for(coro, limit_s))
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(task), limit_s)
        raise
    except Exception as exc:
        event("cleanup_failed", logging.WARNING, what=what, error=type(exc).__name__)


class _PartEnded(Exception):
    pass


async def until_first_ends(*coros: Coroutine[Any, Any, None]) -> None:
    """Run the coroutines in one TaskGroup; when any of them returns, cancel the others.

    An exception from any part propagates (as in a TaskGroup)."""

    async def wrap(coro: Coroutine[Any, Any, None]) -> None:
        await coro
        raise _PartEnded

    try:
        async with asyncio.TaskGroup() as tg:
            for coro in coros:
                tg.create_task(wrap(coro))
    except* _PartEnded:
        pass
