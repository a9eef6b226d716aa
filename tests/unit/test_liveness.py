"""The heartbeat watchdog (apps/orchestrator/liveness.py) on a real event loop: a stall of the
replica's own loop is not a node's missed heartbeats; a node that never heartbeats still dies.

The stall is made certain: the test blocks the loop itself (`time.sleep`, the stall being what is
tested, not a wait), and the node's heartbeat is "read" only after the watchdog's first tick past the
stall, as a reader on a loaded replica reads what sat in its socket. The old watchdog closed the
socket (4008) at that first tick every time."""

from __future__ import annotations

import asyncio
import time

import pytest

from apps.core.protocol.node import CLOSE_HEARTBEAT_TIMEOUT
from apps.orchestrator.connection import NodeConnection
from apps.orchestrator.liveness import watch_heartbeats
from apps.orchestrator.settings import OrchestratorSettings

pytestmark = pytest.mark.timeout(30)
SETTINGS = OrchestratorSettings(heartbeat_interval_s=0.2, missed_heartbeats=2)  # stale after 0.4 s
PERIOD = SETTINGS.heartbeat_interval_s / 2


def _conn() -> NodeConnection:
    return NodeConnection(node_id="n1", location="onprem", gpus=1, models={"m": 4}, send_limit=16)


async def test_a_stall_of_the_replicas_own_loop_is_not_a_missed_heartbeat() -> None:
    conn = _conn()
    watchdog = asyncio.create_task(watch_heartbeats(conn, SETTINGS))
    await asyncio.sleep(0)  # one turn: the watchdog is in its first wait
    time.sleep(3 * SETTINGS.stale_after_s)  # the replica's loop stands still (GC, a starved CPU)
    # The heartbeat the node sent meanwhile is read half a period after the loop runs again.
    asyncio.get_running_loop().call_later(PERIOD / 2, conn.touch)
    with pytest.raises(TimeoutError):  # on the old code: closed with 4008 at the first tick
        await asyncio.wait_for(asyncio.shield(conn.closing.wait()), 4 * PERIOD)
    assert conn.close_code != CLOSE_HEARTBEAT_TIMEOUT
    watchdog.cancel()


async def test_a_node_that_never_heartbeats_still_dies_after_a_stall() -> None:
    conn = _conn()
    watchdog = asyncio.create_task(watch_heartbeats(conn, SETTINGS))
    await asyncio.sleep(0)
    time.sleep(3 * SETTINGS.stale_after_s)  # a stall, then nothing from the node
    started = time.monotonic()
    await asyncio.wait_for(conn.closing.wait(), 20)
    assert conn.close_code == CLOSE_HEARTBEAT_TIMEOUT
    # Judged on the replica's running time: at least the stale bound after the stall, not at once.
    assert time.monotonic() - started >= SETTINGS.stale_after_s - PERIOD
    await watchdog
