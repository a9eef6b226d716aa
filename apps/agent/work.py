"""The requests running on this node: start them, abort them, report how they ended.

Owns the in-flight table (`request_id` → `Relay`) and the order of reporting: a `done` is
journaled (fsync) **before** it is sent, so a crash in between replays it later; an
`error` is sent best-effort. Request tasks live in the agent-wide work TaskGroup, not in a
connection's, so a request aborted by a lost connection still reports its `done`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from apps.agent.connection import Connection
from apps.agent.engine import EngineClient
from apps.agent.health import AgentMetrics
from apps.agent.journal import Journal
from apps.agent.outlet import BoundOutlet
from apps.agent.relay import Relay, RelayTimeouts
from apps.core.protocol import node as proto

log = logging.getLogger("llmfleet.agent.work")


class Work:
    def __init__(
        self,
        engine: EngineClient,
        timeouts: RelayTimeouts,
        journal: Journal,
        metrics: AgentMetrics,
    ) -> None:
        self._engine = engine
        self._timeouts = timeouts
        self._journal = journal
        self._metrics = metrics
        self._relays: dict[str, Relay] = {}
        self._outlets: dict[str, BoundOutlet] = {}  # the connection each request came on
        self.idle = asyncio.Event()  # set while nothing is in flight
        self.idle.set()
        # Called with each request that ended well, after its `done` was sent (prefix announcements).
        self.on_done: Callable[[proto.Assign], None] | None = None

    def __len__(self) -> int:
        return len(self._relays)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._relays

    @property
    def request_ids(self) -> list[str]:
        return list(self._relays)

    def on(self, conn: Connection) -> list[str]:
        """The requests that came on `conn`."""
        return [rid for rid, outlet in self._outlets.items() if outlet.conn is conn]

    def unbound(self) -> list[str]:
        """The requests whose connection has ended (still running or reporting)."""
        return [rid for rid, outlet in self._outlets.items() if outlet.conn.closed]

    def start(self, group: asyncio.TaskGroup, assign: proto.Assign, outlet: BoundOutlet) -> None:
        relay = Relay(assign, self._engine, outlet, self._timeouts)
        self._relays[assign.request_id] = relay
        self._outlets[assign.request_id] = outlet
        self.idle.clear()
        self._metrics.in_flight.set(len(self._relays))
        group.create_task(self._run(relay), name=f"agent-request-{assign.request_id}")

    def abort(self, request_id: str, reason: str) -> bool:
        relay = self._relays.get(request_id)
        if relay is None:
            return False
        relay.abort(reason)
        return True

    def abort_all(self, reason: str, *, handoff: bool = False) -> None:
        for relay in list(self._relays.values()):
            relay.abort(reason, handoff=handoff)

    def abort_on(self, conn: Connection, reason: str, *, handoff: bool = False) -> None:
        """Abort the requests that came on `conn` (it ended, or its handover deadline passed)."""
        for rid in self.on(conn):
            self._relays[rid].abort(reason, handoff=handoff)

    async def _run(self, relay: Relay) -> None:
        rid = relay.request_id
        outlet = self._outlets[rid]
        try:
            try:
                result = await relay.run()
            except Exception:
                log.exception("request failed inside the agent", extra={"request_id": rid})
                result = proto.Error(
                    request_id=rid,
                    status=502,
                    message="node agent failure",
                    chunks_sent=relay.events_sent,
                    completion_tokens=relay.completion_tokens,
                )
            self._metrics.assignments.labels(relay.outcome.value if relay.outcome else "failed").inc()
            if isinstance(result, proto.Done):
                # Journal first (fsync), then send: a crash in between replays it later.
                await asyncio.shield(self._journal.record_done(result))
                self._metrics.journal_pending.set(len(self._journal.pending()))
                await outlet.send_done(result)
                if self.on_done is not None and result.finish_reason != "abort":
                    self.on_done(relay.assign)
            else:
                await outlet.send_error(result)
        finally:
            self._relays.pop(rid, None)
            self._outlets.pop(rid, None)
            self._metrics.in_flight.set(len(self._relays))
            if not self._relays:
                self.idle.set()
