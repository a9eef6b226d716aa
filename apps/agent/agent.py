"""The node agent: dial out, register, heartbeat, run assignments, drain.

`run_agent(settings, deps)` is the only wiring point. Structure (one TaskGroup each):

    Agent.run
      ├─ health server (optional)
      ├─ connection loop: wait for engine → connect → register → serve → backoff → ...
      │    serve: reader · writer · heartbeat   (one connection = one TaskGroup)
      ├─ drain watcher: waits for `drain`/SIGTERM, then finishes work and stops
      └─ work group: one task per assignment (outlives connections: a `done` of a
         request aborted by a lost connection is journaled and replayed on the next one)

States (`AgentState`): STARTING → CONNECTING ⇄ READY; any → DRAINING → STOPPED.
A lost connection aborts every in-flight request (the orchestrator has already treated them as failed;
chunks can no longer reach the client); their `done` frames, with the tokens so far, go to the journal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp
from aiohttp import web

from apps.agent import spot
from apps.agent.backoff import Backoff
from apps.agent.connection import Connection
from apps.agent.deps import AgentConfigError, AgentDeps, AgentState, agent_version
from apps.agent.drain import DrainControl, wait_for
from apps.agent.engine import EngineClient
from apps.agent.health import AgentMetrics, health_app
from apps.agent.heartbeat import HeartbeatSource
from apps.agent.journal import Journal
from apps.agent.kvforward import KvForwarder
from apps.agent.link import Link
from apps.agent.outlet import Outlet
from apps.agent.relay import RelayTimeouts
from apps.agent.settings import AgentSettings
from apps.agent.telemetry import GpuProbe, choose_gpu_probe
from apps.agent.work import Work
from apps.core.aio import first_of
from apps.core.protocol import node as proto

log = logging.getLogger("llmfleet.agent")

_ABORT_WAIT_S = 10.0  # after aborting, wait this long for the aborted requests to report
_CLEANUP_S = 5.0


class Agent:
    def __init__(self, settings: AgentSettings, deps: AgentDeps | None = None) -> None:
        self.settings = settings
        self.deps = deps or AgentDeps()
        self.metrics = AgentMetrics()
        self.journal = Journal(settings.journal, settings.journal_compact_lines)
        self.backoff = Backoff(self.deps.rng, settings.backoff_base_s, settings.backoff_cap_s)
        self.state = AgentState.STARTING
        self.registered = asyncio.Event()  # set while registered (tests and readiness wait on it)
        self.health_port: int | None = None
        self.orchestrator_id: str | None = None
        self._work: Work | None = None
        self._drain = DrainControl(settings.drain_timeout_s)
        self.stopping = asyncio.Event()
        self.outlet = Outlet(self.journal, self.metrics, settings.done_resend_s)
        self._acked = asyncio.Event()
        self._engine: EngineClient | None = None
        self._gpu: GpuProbe | None = self.deps.gpu_probe
        self._beats: HeartbeatSource | None = None
        self._group: asyncio.TaskGroup | None = None
        self.kv = KvForwarder.for_settings(settings)
        self._max_model_len = settings.max_model_len
        self._gpus = settings.gpus
        self._heartbeat_interval_s = settings.heartbeat_interval_s
        self.link = Link(settings, self, self.backoff, self.metrics, self.deps.ssl_context)
        self._timeouts = RelayTimeouts(
            connect_s=settings.engine_connect_timeout_s,
            first_byte_s=settings.engine_first_byte_timeout_s,
            idle_s=settings.engine_idle_timeout_s,
        )

    # -- control ------------------------------------------------------------------------

    def drain(self, deadline_s: float | None = None, reason: str = "drain") -> None:
        """Stop taking work, finish in-flight requests within `deadline_s`, report, exit.

        A second call can only shorten the deadline (a second SIGTERM aborts at once)."""
        if self._drain.request(deadline_s, reason):
            self._set_state(AgentState.DRAINING)

    @property
    def in_flight(self) -> list[str]:
        return self._work.request_ids if self._work is not None else []

    def _running(self) -> int:
        return len(self._work) if self._work is not None else 0

    def _abort_all(self, reason: str, *, handoff: bool = False) -> None:
        if self._work is not None:
            self._work.abort_all(reason, handoff=handoff)

    def ready(self) -> bool:
        return self.state is AgentState.READY

    def _set_state(self, state: AgentState) -> None:
        if self.state in (AgentState.DRAINING, AgentState.STOPPED) and state not in (
            AgentState.DRAINING,
            AgentState.STOPPED,
        ):
            return  # a draining agent never becomes ready again
        self.state = state
        self.metrics.draining.set(1 if state is AgentState.DRAINING else 0)

    # -- main ---------------------------------------------------------------------------

    async def run(self) -> int:
        await self.journal.open()
        self.metrics.journal_pending.set(len(self.journal.pending()))
        runner: web.AppRunner | None = None
        try:
            if self.settings.health_port is not None:
                runner = await self._start_health()
            # No connection cap: one upstream connection per stream (the default pool of
            # 100 would queue the 101st stream behind the others).
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
            async with aiohttp.ClientSession(connector=connector) as session:
                self._engine = EngineClient(
                    session,
                    self.settings.engine_url,
                    self.settings.engine_probe_timeout_s,
                    connect_timeout_s=self._timeouts.connect_s,
                )
                if self._gpu is None:
                    self._gpu = choose_gpu_probe(session, self.settings.dcgm_url, self.settings.nvidia_smi)
                down = self.kv.engine_down_soon if self.kv is not None else None
                self._beats = HeartbeatSource(self._engine, self._gpu, self.metrics, down)
                self._work = Work(self._engine, self._timeouts, self.journal, self.metrics)
                if self.kv is not None:
                    self._work.on_done = self.kv.prefixes.attach(self._engine.token_ids)
                async with asyncio.TaskGroup() as group:
                    self._group = group
                    kv = group.create_task(self.kv.run(), name="agent-kv-events") if self.kv else None
                    async with asyncio.TaskGroup() as tg:
                        tg.create_task(self.link.run(), name="agent-connection-loop")
                        tg.create_task(self._drain_watcher(), name="agent-drain")
                        if self.settings.spot_notice_url:
                            tg.create_task(self._spot_watcher(session), name="agent-spot")
                    # Every request finished (the drain waited for them or aborted them).
                    self._abort_all("agent stopping")
                    if kv is not None:
                        kv.cancel()
                await self._engine.aclose()
        finally:
            self._set_state(AgentState.STOPPED)
            await asyncio.shield(self._cleanup(runner))
        return 0

    async def _cleanup(self, runner: web.AppRunner | None) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_CLEANUP_S):
                await self.journal.close()
                if runner is not None:
                    await runner.cleanup()

    async def _start_health(self) -> web.AppRunner:
        app = health_app(self.ready, lambda: self.state.value, self.metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.settings.health_host, self.settings.health_port or 0)
        await site.start()
        addresses = runner.addresses
        self.health_port = int(addresses[0][1]) if addresses else self.settings.health_port
        return runner

    # -- connection loop ----------------------------------------------------------------

    async def pause(self, seconds: float) -> None:
        """Sleep on the injected clock, but wake up at once when the agent stops."""
        await first_of(self.deps.clock.sleep(seconds), self.stopping.wait())

    async def wait_for_engine(self) -> bool:
        """Register only once the engine answers /health: a node whose model is still
        loading must not get assignments. False if the agent stops first."""
        assert self._engine is not None
        logged = False
        while not self.stopping.is_set():
            if await self._engine.healthy():
                if self._max_model_len is None:
                    self._max_model_len = await self._engine.max_model_len(self.settings.model)
                    if self._max_model_len is None:
                        raise AgentConfigError(
                            "the engine's /v1/models does not report max_model_len: pass --max-model-len"
                        )
                if self._gpus is None:
                    assert self._gpu is not None
                    self._gpus = await self._gpu.count() or 0
                return True
            if not logged:
                log.info("waiting for the engine", extra={"engine_url": self.settings.engine_url})
                logged = True
            await self.pause(self.settings.engine_wait_poll_s)
        return False

    def register_frame(self, version: int = proto.PROTOCOL_VERSION) -> proto.Register:
        assert self._max_model_len is not None
        revision = self.settings.model_revision if version >= proto.REVISIONS_VERSION else ""  # v6 on
        return proto.Register(
            node_id=self.settings.node_id,
            token=self.settings.node_token.get_secret_value(),
            version=version,
            gpus=self._gpus or 0,
            models=[
                proto.ModelInfo(
                    name=self.settings.model,
                    max_num_seqs=self.settings.max_num_seqs,
                    max_model_len=self._max_model_len,
                    revision=revision,
                )
            ],
            location=self.settings.location,
            agent_version=agent_version(),
            # Requests whose connection ended (a handed-over socket still carries its own).
            in_flight=self._work.unbound() if self._work is not None else [],
        )

    def on_registered(self, conn: Connection, ack: proto.RegisterAck) -> None:
        self.outlet.conn = conn
        for old in self.link.retiring:  # tell the replica that handed this node over
            assert self._work is not None
            assert self._group is not None
            handed = proto.HandedOver(orchestrator_id=ack.orchestrator_id, in_flight=self._work.on(old))
            self._group.create_task(old.send(handed), name="agent-handed-over")
        self.orchestrator_id = ack.orchestrator_id
        self._heartbeat_interval_s = ack.heartbeat_interval_s or self.settings.heartbeat_interval_s
        self._set_state(AgentState.READY)
        self.registered.set()
        self.metrics.connected.set(1)
        log.info(
            "registered", extra={"orchestrator_id": ack.orchestrator_id, "node_id": self.settings.node_id}
        )
        for request_id in ack.unknown_requests:
            if self._work is not None:
                self._work.abort(request_id, "orchestrator no longer relays it")
        if self.kv is not None and conn.version >= proto.KV_EVENTS_VERSION and self._group is not None:
            self._group.create_task(self.kv.connected(conn.send), name="agent-kv-events-connected")

    def on_connection_ended(self, conn: Connection | None) -> None:
        """`conn` ended (None: an attempt that never registered): the requests that came on it end."""
        if conn is not None:
            conn.close()
            if self.kv is not None:
                self.kv.disconnected(conn.send)
            if self._work is not None:
                self._work.abort_on(conn, "connection to the orchestrator lost")
        if conn is None or conn is self.outlet.conn:
            self.outlet.conn = None
            self.registered.clear()
            self.metrics.connected.set(0)
            self._set_state(AgentState.CONNECTING)

    def _on_handover(self, conn: Connection, frame: proto.Handover) -> None:
        """The orchestrator of `conn` stops: register elsewhere, finish `conn`'s requests on it."""
        assert self._group is not None
        assert self._work is not None
        if not self.link.hand_over(conn):
            return
        log.info("handover", extra={"deadline_s": frame.deadline_s, "in_flight": len(self._work.on(conn))})
        self.outlet.conn = None
        self.registered.clear()
        self._set_state(AgentState.CONNECTING)
        self._group.create_task(self._handover_deadline(conn, frame.deadline_s), name="agent-handover")

    async def _handover_deadline(self, conn: Connection, deadline_s: float) -> None:
        await first_of(conn.wait_closed(), self.deps.clock.sleep(deadline_s))
        if not conn.closed and self._work is not None and self._work.on(conn):
            # Streams with output end with a `node_draining` error carrying the exact tokens so far.
            log.warning("handover deadline passed", extra={"in_flight": len(self._work.on(conn))})
            self._work.abort_on(conn, "handover deadline passed", handoff=True)

    async def handle(self, conn: Connection, frame: proto.ServerFrame) -> None:
        if isinstance(frame, proto.Assign):
            await self._on_assign(conn, frame)
        elif isinstance(frame, proto.Cancel):
            if self._work is not None:
                self._work.abort(frame.request_id, "cancelled by the orchestrator")
        elif isinstance(frame, proto.DoneAck):
            if await self.journal.ack(frame.request_id):
                self.outlet.acked(frame.request_id)
                self.metrics.journal_pending.set(len(self.journal.pending()))
                self._acked.set()
        elif isinstance(frame, proto.Handover):
            self._on_handover(conn, frame)
        elif isinstance(frame, proto.Drain):
            log.info("drain requested by the orchestrator", extra={"deadline_s": frame.deadline_s})
            self.drain(frame.deadline_s, reason="drain")
        elif isinstance(frame, proto.LoadModel):
            # One engine serves one model; loading another means a new engine process
            # (a new Deployment on EKS, a new unit on premises). Logged, not faked.
            log.warning("load_model is not supported by this node", extra={"model": frame.name})
        else:
            log.warning("unexpected frame after registration", extra={"type": frame.type})

    async def _on_assign(self, conn: Connection, assign: proto.Assign) -> None:
        assert self._work is not None
        assert self._group is not None
        rid = assign.request_id
        if rid in self._work:
            log.warning("duplicate assign ignored", extra={"request_id": rid})
            return
        if self.journal.is_pending(rid):
            for done in self.journal.pending():
                if done.request_id == rid:
                    await self.outlet.send_done_on(conn, done)  # finished already: the done was lost
            return
        refusal: tuple[int, str, str] | None = None
        limit = self.settings.max_in_flight or 4 * self.settings.max_num_seqs
        if self.state is not AgentState.READY:
            refusal = (503, "node is draining", "service_unavailable")
        elif len(self._work) >= limit:
            refusal = (503, f"node is at its limit of {limit} requests in flight", "service_unavailable")
        elif assign.model != self.settings.model:
            refusal = (404, f"model {assign.model!r} is not served by this node", "invalid_request_error")
        if refusal is not None:
            self.metrics.assignments.labels("refused").inc()
            await conn.send(
                proto.Error(request_id=rid, status=refusal[0], message=refusal[1], error_type=refusal[2])
            )
            return
        self._work.start(self._group, assign, self.outlet.bound(conn))

    # -- heartbeat ----------------------------------------------------------------------

    async def serving(self, conn: Connection) -> None:
        """While `conn` is served: the journal's unacknowledged dones, then heartbeats."""
        await self.outlet.replay_journal(conn)
        while not conn.retiring:  # a handed-over connection carries no heartbeats
            await self.send_heartbeat_now()
            await self.outlet.resend_unacked(conn)
            await asyncio.sleep(self._heartbeat_interval_s)

    async def send_heartbeat_now(self) -> None:
        """One heartbeat now (also when draining starts, so routing stops at once)."""
        conn = self.outlet.conn
        if conn is None or self._beats is None:
            return
        beat = await self._beats.next(self._running(), self.state is AgentState.DRAINING)
        if beat is not None:
            await conn.send(beat)
            self.metrics.heartbeats.inc()

    # -- drain --------------------------------------------------------------------------

    async def _spot_watcher(self, session: aiohttp.ClientSession) -> None:
        url = self.settings.spot_notice_url
        assert url is not None
        await spot.watch(
            session,
            url,
            poll_s=self.settings.spot_poll_s,
            handoff_s=self.settings.spot_handoff_s,
            on_notice=lambda budget: self.drain(budget, reason="spot_interruption"),
            stop=self.stopping,
        )

    async def _drain_watcher(self) -> None:
        await self._drain.requested.wait()
        assert self._work is not None
        log.info("draining", extra={"deadline_s": self._drain.deadline_s, "in_flight": self._running()})
        await self.send_heartbeat_now()
        if not await self._drain.wait_idle(self._work.idle):
            log.warning("drain deadline passed: handing off", extra={"in_flight": self._running()})
            # Streams with output end with a `node_draining` error: the orchestrator resumes them.
            self._abort_all("drain deadline passed", handoff=True)
            await wait_for(self._work.idle, _ABORT_WAIT_S)
        await self._wait_for_acks()
        conn = self.outlet.conn
        if conn is not None:
            await conn.send(proto.Drained(reason=self._drain.reason))
            await conn.flush(_CLEANUP_S)
        # No reconnect from here on; the connection itself stays up (nothing watches this in `_serve`).
        self.stopping.set()
        if conn is not None:
            # "Flushed" means written to the socket, not read by the orchestrator: closing now would
            # drop what it has not handled yet (its handler ends with the socket), the handed-off
            # `error`s and this `drained` with them. It closes the socket itself once it has read
            # `drained` (so every frame before it); wait (bounded) for that, then close anyway.
            await first_of(conn.wait_closed(), self.deps.clock.sleep(_CLEANUP_S))
            with contextlib.suppress(TimeoutError, aiohttp.ClientError, ConnectionError):
                async with asyncio.timeout(_CLEANUP_S):
                    await conn.ws.close(code=proto.CLOSE_NORMAL, message=b"drained")
        log.info("drained", extra={"reason": self._drain.reason, "unacked": len(self.journal.pending())})

    async def _wait_for_acks(self) -> None:
        """Bounded: give the orchestrator a moment to acknowledge the last dones."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.drain_ack_wait_s
        while self.journal.pending() and self.outlet.conn is not None and loop.time() < deadline:
            self._acked.clear()
            await wait_for(self._acked, deadline - loop.time())
