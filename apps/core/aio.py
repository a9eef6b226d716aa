"""Small asyncio helpers used by every app: shielded bounded cleanup, first-of, until-first-ends,
the stop event of a service's main loop."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Coroutine
from typing import Any

log = logging.getLogger("llmfleet.aio")


async def shielded(cleanup: Awaitable[Any], limit_s: float, what: str) -> None:
    """Run `cleanup`, which must happen even if the caller is cancelled, bounded by `limit_s`.

    A failure or a timeout of the cleanup is logged, not raised (cleanup must not mask the original
    outcome); a cancellation of the caller is re-raised once the cleanup finished or timed out."""
    task = asyncio.ensure_future(asyncio.wait_for(cleanup, limit_s))
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task], timeout=limit_s)
        if task.done() and not task.cancelled() and task.exception() is not None:
            _failed(what, task.exception())
        raise
    except Exception as exc:
        _failed(what, exc)


def _failed(what: str, exc: BaseException | None) -> None:
    log.warning("cleanup failed", extra={"what": what, "error": type(exc).__name__})


async def first_of(*aws: Awaitable[Any], limit_s: float | None = None) -> tuple[asyncio.Future[Any], ...]:
    """Wait until the first of `aws` is done (or `limit_s`); cancel the others. Returns their futures in
    the order given: the caller asks which one is `done()` (a cancelled one is never a winner:
    `won(f)`). A cancellation of the caller cancels all of them."""
    futures = tuple(asyncio.ensure_future(aw) for aw in aws)
    try:
        await asyncio.wait(futures, timeout=limit_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for fut in futures:
            fut.cancel()
    return futures


def won(fut: asyncio.Future[Any]) -> bool:
    """`fut` (from `first_of`) completed with a result."""
    return fut.done() and not fut.cancelled() and fut.exception() is None


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


def stop_on_signals() -> asyncio.Event:
    """An event that SIGTERM or SIGINT sets (handlers on the running loop): what a service's main
    coroutine waits on before it shuts down."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop
