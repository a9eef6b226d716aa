"""A scripted orchestrator (aiohttp WebSocket server) for the agent's unit tests.

`script` decides how each successive `register` is answered: "ack", "hold" (ack once
`release_ack` is set), a `RegisterRefused` frame, or `("close", code)`. Every frame a node sends is kept in
`frames` as `(connection number, frame)`, and the number of frames each message carried
(protocol version 2 batches several) in `message_sizes`; `wait_for(predicate)` waits for one
without sleeping. `auto_ack_done` answers every `done` with `done_ack`. Like the real one, it
closes the socket once it has read `drained`. `stall_on_draining` makes it slow the way the real
one is (it writes to PostgreSQL when a node starts draining): after a `draining` heartbeat it
handles nothing more until that event is set; with `handler_cancellation` (as the real
orchestrator runs) a socket the node closes meanwhile ends the handler, and with it every
frame received but not yet handled.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import WSMsgType, web

from apps.agent.agent import Agent
from apps.agent.deps import AgentDeps
from apps.agent.settings import AgentSettings
from apps.agent.telemetry import NoGpuProbe
from apps.core.protocol import node as proto
from tests.fakes.engine_sim import SimEngine, engine_sim
from tests.fakes.engine_sim import body as engine_body
from tests.fakes.fake_engine import FakeEngine

Action = str | proto.RegisterRefused | tuple[str, int]
F = TypeVar("F", bound=proto._Frame)


@dataclass
class FakeOrchestrator:
    script: list[Action] = field(default_factory=list)
    auto_ack_done: bool = True
    heartbeat_interval_s: float = 0.05  # sent in register_ack; the agent follows it
    orchestrator_id: str = "orch-test"
    unknown_requests: list[str] = field(default_factory=list)
    stall_on_draining: asyncio.Event | None = None
    handler_cancellation: bool = False
    close_on_drained: bool = True  # False: an older orchestrator (the node closes after a bound)
    ssl_context: ssl.SSLContext | None = None
    frames: list[tuple[int, proto.NodeFrame]] = field(default_factory=list)
    registrations: list[proto.Register] = field(default_factory=list)
    message_sizes: list[tuple[int, int]] = field(default_factory=list)  # (connection, frames in it)
    release_ack: asyncio.Event = field(default_factory=asyncio.Event)  # for the "hold" action
    connections: int = 0
    port: int = 0
    _ws: web.WebSocketResponse | None = None
    _cond: asyncio.Condition = field(default_factory=asyncio.Condition)
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        scheme = "wss" if self.ssl_context else "ws"
        return f"{scheme}://127.0.0.1:{self.port}/v1/nodes/connect"

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/v1/nodes/connect", self._connect)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=self.handler_cancellation)
        await self._runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", self.port))
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock, ssl_context=self.ssl_context).start()
        return self.url

    async def stop(self) -> None:
        if self._ws is not None and not self._ws.closed:
            await self._ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    # -- test controls ------------------------------------------------------------------

    async def send(self, frame: proto._Frame) -> None:
        assert self._ws is not None, "no node connected"
        await self._ws.send_str(proto.encode(frame))

    async def send_batch(self, frames: list[proto._Frame]) -> None:
        """Several frames in one message (protocol version 2)."""
        assert self._ws is not None
        await self._ws.send_str(proto.join_frames([proto.encode(f) for f in frames]))

    async def close_socket(self, code: int) -> None:
        """Close the current connection with `code` (a handover ends with 4011)."""
        ws = self._ws
        assert ws is not None
        await ws.close(code=code, message=b"closed by the test")

    async def cut(self) -> None:
        """Drop the current connection without a close handshake (a cut cable)."""
        ws = self._ws
        assert ws is not None
        self._ws = None
        req_transport = getattr(ws, "_req", None)
        transport = req_transport.transport if req_transport is not None else None
        if transport is not None:
            transport.abort()

    def of_type(self, type_: type[F], conn: int | None = None) -> list[F]:
        return [f for c, f in self.frames if isinstance(f, type_) and (conn is None or c == conn)]

    async def wait_for(
        self, predicate: Callable[[list[tuple[int, proto.NodeFrame]]], bool], timeout: float = 10.0
    ) -> None:
        async with asyncio.timeout(timeout), self._cond:
            await self._cond.wait_for(lambda: predicate(self.frames))

    async def wait_connections(self, n: int, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout), self._cond:
            await self._cond.wait_for(lambda: self.connections >= n)

    # -- server -------------------------------------------------------------------------

    async def _record(self, conn: int, frame: proto.NodeFrame) -> None:
        async with self._cond:
            self.frames.append((conn, frame))
            self._cond.notify_all()

    async def _connect(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        first = await ws.receive()
        if first.type != WSMsgType.TEXT:
            return ws
        register = proto.decode_node_frame(first.data)
        assert isinstance(register, proto.Register)
        async with self._cond:
            self.registrations.append(register)
            self.connections += 1
            conn = self.connections
            self._cond.notify_all()
        action: Action = self.script.pop(0) if self.script else "ack"
        if isinstance(action, proto.RegisterRefused):
            await ws.send_str(proto.encode(action))
            await ws.close(code=proto.CLOSE_REGISTRATION_REFUSED)
            return ws
        if isinstance(action, tuple):
            await ws.close(code=action[1])
            return ws
        if action == "hold":
            await self.release_ack.wait()
        self._ws = ws
        await ws.send_str(
            proto.encode(
                proto.RegisterAck(
                    orchestrator_id=self.orchestrator_id,
                    heartbeat_interval_s=self.heartbeat_interval_s,
                    unknown_requests=self.unknown_requests,
                )
            )
        )
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                continue
            texts = proto.split_frames(msg.data)
            self.message_sizes.append((conn, len(texts)))
            for text in texts:
                frame = proto.decode_node_frame(text)
                await self._record(conn, frame)
                if isinstance(frame, proto.Done) and self.auto_ack_done and not ws.closed:
                    await ws.send_str(proto.encode(proto.DoneAck(request_id=frame.request_id)))
                elif isinstance(frame, proto.Heartbeat) and frame.draining and self.stall_on_draining:
                    await self.stall_on_draining.wait()
                elif isinstance(frame, proto.Drained) and self.close_on_drained:
                    await ws.close(code=proto.CLOSE_NORMAL, message=b"drained")
        if self._ws is ws:
            self._ws = None
        return ws


# -- harness: an in-process agent between an engine (enginesim in-process by default) and
# this fake orchestrator ---------------------------------------------------------------


@dataclass
class AgentRun:
    agent: Agent
    engine: Any  # enginesim (in-process `SimEngine` or a process), or a FakeEngine for a vLLM variant
    orch: FakeOrchestrator
    task: asyncio.Task[int]

    def assign(
        self,
        request_id: str,
        tokens: int | None = None,
        *,
        endless: bool = False,
        fake: dict[str, Any] | None = None,
        **body: Any,
    ) -> proto.Assign:
        """`tokens` (or `endless`): what enginesim generates; `fake`: a FakeEngine's `x_fake`."""
        model = self.engine.model
        payload = {**engine_body(tokens, endless=endless, **body), "model": model}
        if fake is not None:
            payload["x_fake"] = fake
        return proto.Assign(request_id=request_id, model=model, body=payload)

    async def result(self, request_id: str, timeout: float = 10.0) -> proto.Done | proto.Error:
        def has(frames: list[tuple[int, proto.NodeFrame]]) -> bool:
            return any(
                isinstance(f, proto.Done | proto.Error) and f.request_id == request_id for _, f in frames
            )

        await self.orch.wait_for(has, timeout)
        for _, f in self.orch.frames:
            if isinstance(f, proto.Done | proto.Error) and f.request_id == request_id:
                return f
        raise AssertionError("unreachable")

    def chunks(self, request_id: str) -> str:
        return "".join(
            f.delta for _, f in self.orch.frames if isinstance(f, proto.Chunk) and f.request_id == request_id
        )


def agent_settings(
    orch: FakeOrchestrator, engine: SimEngine | FakeEngine, journal: Path, **overrides: Any
) -> AgentSettings:
    values: dict[str, Any] = {
        "orchestrator_url": orch.url,
        "node_id": "node-1",
        "node_token": "nt-test",
        "engine_url": engine.url,
        "model": engine.model,
        "max_num_seqs": 8,
        "journal": journal,
        "heartbeat_interval_s": 0.05,
        "drain_ack_wait_s": 2.0,
        "gpus": 1,
    }
    values.update(overrides)
    return AgentSettings(**values)


async def stop_agent(agent: Agent, task: asyncio.Task[int]) -> None:
    """Drain `agent` at once (a test's teardown) and wait, bounded, until its `run()` task ends."""
    if not task.done():
        agent.drain(0.0, reason="test teardown")
    async with asyncio.timeout(15):
        await task


@asynccontextmanager
async def running_agent(
    tmp_path: Path,
    *,
    engine: SimEngine | FakeEngine | None = None,
    engine_speed: float = 0.2,
    orch: FakeOrchestrator | None = None,
    deps: AgentDeps | None = None,
    wait_registered: bool = True,
    more: tuple[FakeOrchestrator, ...] = (),
    **overrides: Any,
) -> AsyncIterator[AgentRun]:
    """`more`: further replicas, after `orch` in the agent's URL list (a handover goes to the next).
    Without `engine`: enginesim in-process (`engine_speed`)."""
    if engine is None:
        async with (
            engine_sim(engine_speed) as sim,
            running_agent(
                tmp_path,
                engine=sim,
                orch=orch,
                deps=deps,
                wait_registered=wait_registered,
                more=more,
                **overrides,
            ) as run,
        ):
            yield run
        return
    orch = orch or FakeOrchestrator()
    if isinstance(engine, FakeEngine):
        await engine.start()
    await orch.start()
    for other in more:
        await other.start()
    if more:
        overrides.setdefault("orchestrator_url", ",".join([orch.url, *(o.url for o in more)]))
    settings = agent_settings(orch, engine, tmp_path / "journal.jsonl", **overrides)
    agent = Agent(settings, deps or AgentDeps(gpu_probe=NoGpuProbe()))
    task = asyncio.create_task(agent.run())
    try:
        if wait_registered:
            async with asyncio.timeout(10):
                await agent.registered.wait()
        yield AgentRun(agent, engine, orch, task)
    finally:
        try:
            await stop_agent(agent, task)
        finally:
            await orch.stop()
            for other in more:
                await other.stop()
            if isinstance(engine, FakeEngine):
                await engine.stop()
