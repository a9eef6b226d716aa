"""When a node's socket is dead: `missed_heartbeats` heartbeat intervals without one.

Not counted: time this replica's own event loop stood still. A heartbeat that arrived during such a
stall sits unread in the socket until the loop runs again, and the watchdog's late tick would find it
missing. A loaded CI run lost a healthy node that way (its in-process gateway, replica, agent and engine
stalled together for over a second: the 1-second budget of the tests' 0.5-s interval). A tick late by
more than its own period counts as a stall until the next heartbeat is heard; under a sustained stall
the node still dies once `stale_after_s` of the replica's running time passed without a heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib

from apps.core.protocol.node import CLOSE_HEARTBEAT_TIMEOUT
from apps.orchestrator.connection import NodeConnection
from apps.orchestrator.settings import OrchestratorSettings


async def watch_heartbeats(conn: NodeConnection, settings: OrchestratorSettings) -> None:
    """Close `conn` with 4008 once it missed its heartbeats (not while it is handed over)."""
    loop = asyncio.get_running_loop()
    period = settings.heartbeat_interval_s / 2
    stalled, seen = 0.0, conn.last_heartbeat
    while not conn.closing.is_set():
        started = loop.time()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(conn.closing.wait(), period)
        if conn.last_heartbeat != seen:  # heard since: earlier stalls no longer count
            stalled, seen = 0.0, conn.last_heartbeat
        late = loop.time() - started - period
        if late > period:  # the loop stood still: what the node sent meanwhile may be unread
            stalled += late
            continue  # the readers first
        if conn.heartbeat_age() - stalled > settings.stale_after_s and not conn.handing_over:
            conn.close(CLOSE_HEARTBEAT_TIMEOUT, f"missed {settings.missed_heartbeats} heartbeats")
