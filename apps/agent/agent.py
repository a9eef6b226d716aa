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
A lost connection aborts every in-flight request (the orchestrator has already
treated them as failed; chunks can no longer reach the client); their `done` frames
carry the tokens produced so far and go to the journal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl

import aiohttp
from aiohttp import web
from pydantic import ValidationError

from apps.agent import spot
from apps.agent.backoff import Backoff
from apps.agent.connection import Connection, ConnectionLost, RegistrationFailed, register
from apps.agent.deps import AgentConfigError, AgentDeps, AgentState, agent_version
from apps.agent.drain import DrainControl, wait_for
from apps.agent.engine import EngineClient
from apps.agent.health import AgentMetrics, health_app
from apps.agent.heartbeat import HeartbeatSource
from apps.agent.journal import Journal
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
        self._stopping = asyncio.Event()
        self._conn: Connection | None = None
        self._done_sent_at: dict[str, float] = {}
        self._acked = asyncio.Event()
        self._engine: EngineClient | None = None
        self._gpu: GpuProbe | None = self.deps.gpu_probe
        self._beats: HeartbeatSource | None = None
        self._group: asyncio.TaskGroup | None = None
        self._max_model_len = settings.max_model_len
        self._protocol_version = proto.PROTOCOL_VERSION  # the next attempt's (1 after a 4001)
        self._gpus = settings.gpus
        self._heartbeat_interval_s = settings.heartbeat_interval_s
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
                self._beats = HeartbeatSource(self._engine, self._gpu, self.metrics)
                self._work = Work(self._engine, self._timeouts, self.journal, self.metrics, self)
                async with asyncio.TaskGroup() as group:
                    self._group = group
                    async with asyncio.TaskGroup() as tg:
                        tg.create_task(self._connection_loop(), name="agent-connection-loop")
                        tg.create_task(self._drain_watcher(), name="agent-drain")
                        if self.settings.spot_notice_url:
                            tg.create_task(self._spot_watcher(session), name="agent-spot")
                    # Every request finished (the drain waited for them or aborted them).
                    self._abort_all("agent stopping")
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

    async def _pause(self, seconds: float) -> None:
        """Sleep on the injected clock, but wake up at once when the agent stops."""
        await first_of(self.deps.clock.sleep(seconds), self._stopping.wait())

    async def _wait_for_engine(self) -> bool:
        """Register only once the engine answers /health: a node whose model is still
        loading must not get assignments. False if the agent stops first."""
        assert self._engine is not None
        logged = False
        while not self._stopping.is_set():
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
            await self._pause(self.settings.engine_wait_poll_s)
        return False

    def _ssl(self) -> ssl.SSLContext | bool:
        if not self.settings.orchestrator_url.startswith("wss://"):
            return False
        if self.deps.ssl_context is not None:
            return self.deps.ssl_context
        cafile = str(self.settings.ca_bundle) if self.settings.ca_bundle else None
        return ssl.create_default_context(cafile=cafile)

    def _register_frame(self, version: int = proto.PROTOCOL_VERSION) -> proto.Register:
        assert self._max_model_len is not None
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
                )
            ],
            location=self.settings.location,
            agent_version=agent_version(),
            in_flight=self.in_flight,
        )

    async def _connection_loop(self) -> None:
        ssl_ctx = self._ssl()
        async with aiohttp.ClientSession() as ws_session:
            while not self._stopping.is_set():
                if not await self._wait_for_engine():
                    return
                self._set_state(AgentState.CONNECTING)
                retry_after: float | None = None
                version, self._protocol_version = self._protocol_version, proto.PROTOCOL_VERSION
                try:
                    async with ws_session.ws_connect(
                        self.settings.orchestrator_url,
                        ssl=ssl_ctx,
                        heartbeat=self.settings.ws_ping_interval_s,
                        timeout=aiohttp.ClientWSTimeout(ws_close=_CLEANUP_S),
                        max_msg_size=16 * 1024 * 1024,
                    ) as ws:
                        ack = await register(
                            ws, self._register_frame(version), self.settings.register_timeout_s
                        )
                        if self._stopping.is_set():
                            return  # drained (SIGTERM) while this registration was in flight
                        self.metrics.connects.labels("registered").inc()
                        self.backoff.reset()
                        await self._serve(ws, ack, batching=version >= proto.BATCHING_VERSION)
                except RegistrationFailed as exc:
                    self.metrics.connects.labels("refused").inc()
                    retry_after = exc.retry_after_s
                    if exc.close_code == proto.CLOSE_UNSUPPORTED_VERSION and version > 1:
                        # An orchestrator older than this agent: speak version 1 to it (no batched
                        # messages) on the next attempt; the newest version is tried again after.
                        self._protocol_version = 1
                    log.warning(
                        "registration failed",
                        extra={
                            "reason": exc.reason,
                            "close_code": exc.close_code,
                            "retry_after_s": retry_after,
                        },
                    )
                except ConnectionLost as exc:
                    if self._stopping.is_set():
                        log.info("connection closed after drain")
                    else:
                        log.warning("connection lost", extra={"reason": str(exc)})
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    self.metrics.connects.labels("failed").inc()
                    log.warning(
                        "cannot reach the orchestrator", extra={"error": f"{type(exc).__name__}: {exc}"}
                    )
                finally:
                    self._connection_ended()
                if self._stopping.is_set():
                    return
                window = self.backoff.window()  # the bound before jitter (doubles per attempt)
                delay = self.backoff.next_delay(retry_after)
                log.info(
                    "reconnecting",
                    extra={
                        "delay_s": round(delay, 3),
                        "window_s": round(window, 3),
                        "retry_after_s": retry_after,
                        "attempt": self.backoff.attempt,
                    },
                )
                await self._pause(delay)

    def _connection_ended(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self.registered.clear()
        self.metrics.connected.set(0)
        self._set_state(AgentState.CONNECTING)
        self._abort_all("connection to the orchestrator lost")

    async def _serve(
        self, ws: aiohttp.ClientWebSocketResponse, ack: proto.RegisterAck, *, batching: bool
    ) -> None:
        conn = Connection(ws, self.settings.send_queue_size, batching=batching)
        self._conn = conn
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
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(conn.writer(), name="agent-writer")
                tg.create_task(self._reader(conn), name="agent-reader")
                tg.create_task(self._heartbeat(conn), name="agent-heartbeat")
                for done in self.journal.pending():
                    await self._send_done(conn, done)
        except* (ConnectionLost, aiohttp.ClientError, ConnectionError) as group:
            first = group.exceptions[0]
            raise (
                first if isinstance(first, ConnectionLost) else ConnectionLost(ws.close_code, str(first))
            ) from None

    async def _reader(self, conn: Connection) -> None:
        async for msg in conn.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            for text in proto.split_frames(msg.data):  # one frame, or (version 2) a batch
                try:
                    frame = proto.decode_server_frame(text)
                except ValidationError:
                    log.warning("ignoring an unreadable frame from the orchestrator")
                    continue
                await self._handle(conn, frame)
        raise ConnectionLost(conn.ws.close_code, "closed by the orchestrator")

    async def _handle(self, conn: Connection, frame: proto.ServerFrame) -> None:
        if isinstance(frame, proto.Assign):
            await self._on_assign(conn, frame)
        elif isinstance(frame, proto.Cancel):
            if self._work is not None:
                self._work.abort(frame.request_id, "cancelled by the orchestrator")
        elif isinstance(frame, proto.DoneAck):
            if await self.journal.ack(frame.request_id):
                self._done_sent_at.pop(frame.request_id, None)
                self.metrics.journal_pending.set(len(self.journal.pending()))
                self._acked.set()
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
                    await self._send_done(conn, done)  # finished already: the done was lost
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
        self._work.start(self._group, assign)

    async def send_chunk(self, frame: proto.Chunk, *, first: bool = False) -> None:
        """`ChunkSink` for the relays: to the live connection, dropped when there is none. A
        request's first chunk is urgent (it leads its batch)."""
        conn = self._conn
        if conn is not None:
            await conn.send(frame, urgent=first)

    async def send_done(self, frame: proto.Done) -> None:
        conn = self._conn
        if conn is not None:
            await self._send_done(conn, frame)

    async def send_error(self, frame: proto.Error) -> None:
        conn = self._conn
        if conn is not None:
            await conn.send(frame)

    async def _send_done(self, conn: Connection, done: proto.Done) -> None:
        self._done_sent_at[done.request_id] = asyncio.get_running_loop().time()
        await conn.send(done)

    # -- heartbeat ----------------------------------------------------------------------

    async def _heartbeat(self, conn: Connection) -> None:
        while True:
            await self.send_heartbeat_now()
            await self._resend_unacked(conn)
            await asyncio.sleep(self._heartbeat_interval_s)

    async def send_heartbeat_now(self) -> None:
        """One heartbeat now (also when draining starts, so routing stops at once)."""
        conn = self._conn
        if conn is None or self._beats is None:
            return
        beat = await self._beats.next(self._running(), self.state is AgentState.DRAINING)
        if beat is not None:
            await conn.send(beat)
            self.metrics.heartbeats.inc()

    async def _resend_unacked(self, conn: Connection) -> None:
        now = asyncio.get_running_loop().time()
        for done in self.journal.pending():
            sent = self._done_sent_at.get(done.request_id)
            if sent is None or now - sent >= self.settings.done_resend_s:
                await self._send_done(conn, done)

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
            stop=self._stopping,
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
        conn = self._conn
        if conn is not None:
            await conn.send(proto.Drained(reason=self._drain.reason))
            await conn.flush(_CLEANUP_S)
        # No reconnect from here on; the connection itself stays up (nothing watches this in `_serve`).
        self._stopping.set()
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
        while self.journal.pending() and self._conn is not None and loop.time() < deadline:
            self._acked.clear()
            await wait_for(self._acked, deadline - loop.time())
