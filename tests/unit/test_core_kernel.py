"""The shared kernel: `apps.core.aio`, `apps.core.logs`, `apps.core.clock`."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from datetime import UTC

import pytest

from apps.core.aio import first_of, shielded, stop_on_signals, until_first_ends, won
from apps.core.clock import SYSTEM
from apps.core.logs import JsonFormatter, safe_extra


async def test_shielded_cleanup_survives_the_callers_cancellation() -> None:
    started, finished = asyncio.Event(), asyncio.Event()
    release = asyncio.Event()

    async def cleanup() -> None:
        started.set()
        await release.wait()
        finished.set()

    caller = asyncio.ensure_future(shielded(cleanup(), 5.0, "test"))
    await started.wait()
    caller.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert finished.is_set()  # the cleanup ran to its end before the cancellation went on


async def test_shielded_logs_a_failing_or_slow_cleanup_instead_of_raising(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def boom() -> None:
        raise RuntimeError("store down")

    async def slow() -> None:
        await asyncio.Event().wait()

    with caplog.at_level(logging.WARNING, "llmfleet.aio"):
        await shielded(boom(), 1.0, "boom")
        await shielded(slow(), 0.01, "slow")
    assert [(r.what, r.error) for r in caplog.records] == [("boom", "RuntimeError"), ("slow", "TimeoutError")]  # type: ignore[attr-defined]


async def test_first_of_returns_in_order_and_cancels_the_rest() -> None:
    gate = asyncio.Event()
    gate.set()
    never = asyncio.Event()
    a, b = await first_of(never.wait(), gate.wait())
    assert won(b)
    assert not won(a)
    await asyncio.wait([a])  # the cancellation lands
    assert a.cancelled()
    (c,) = await first_of(never.wait(), limit_s=0.01)
    await asyncio.wait([c])
    assert c.cancelled()
    assert not won(c)


async def test_until_first_ends_cancels_the_other_parts() -> None:
    cancelled = asyncio.Event()

    async def short() -> None:
        return None

    async def long() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    await until_first_ends(short(), long())
    assert cancelled.is_set()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_the_stop_event_is_set_by_sigterm_and_sigint(sig: signal.Signals) -> None:
    loop = asyncio.get_running_loop()
    try:
        stop = stop_on_signals()
        assert not stop.is_set()
        os.kill(os.getpid(), sig)
        await asyncio.wait_for(stop.wait(), 5)
    finally:
        for s in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(s)


def test_one_json_line_with_iso_utc_time_and_the_extra_fields() -> None:
    record = logging.makeLogRecord(
        {"name": "llmfleet.x", "levelname": "WARNING", "msg": "hello", "created": 0.5, "msecs": 500.0}
    )
    record.__dict__.update(safe_extra({"request_id": "r1", "name": "shadow"}))
    line = json.loads(JsonFormatter().format(record))
    assert line == {
        "ts": "1970-01-01T00:00:00.500Z",
        "level": "warning",
        "logger": "llmfleet.x",
        "msg": "hello",
        "request_id": "r1",
        "name_": "shadow",
    }


def test_the_system_clock_is_aware_utc() -> None:
    assert SYSTEM.now().tzinfo is UTC
    assert abs(SYSTEM.now().timestamp() - SYSTEM.wall()) < 5
