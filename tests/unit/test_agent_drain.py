"""Drain (frame or SIGTERM): no new work, in-flight finishes within a bound, `drained`,
exit 0; readiness follows. A lost connection aborts in-flight work and journals it."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

from apps.agent.deps import AgentDeps, AgentState
from apps.agent.main import run_agent
from apps.agent.telemetry import NoGpuProbe
from apps.core.protocol import node as proto
from tests.fakes.engine_sim import body as engine_body
from tests.fakes.engine_sim import engine_sim
from tests.fakes.fake_orchestrator import FakeOrchestrator, agent_settings, running_agent


async def _get(port: int, path: str) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}{path}") as resp:
        return resp.status, await resp.json()


async def test_drain_frame_finishes_in_flight_refuses_new_work_and_exits(tmp_path: Path) -> None:
    async with running_agent(tmp_path, health_port=0) as run:
        port = run.agent.health_port
        assert port is not None
        assert (await _get(port, "/readyz"))[0] == 200
        await run.orch.send(run.assign("d1", 300))
        await run.orch.wait_for(lambda _: "data: " in run.chunks("d1"))
        await run.orch.send(proto.Drain(deadline_s=30))
        await run.orch.wait_for(lambda _: any(h.draining for h in run.orch.of_type(proto.Heartbeat)))
        status, body = await _get(port, "/readyz")
        assert (status, body["state"]) == (503, "draining")
        assert (await _get(port, "/livez"))[0] == 200  # draining is alive, not dead
        await run.orch.send(run.assign("d2", 1))
        refused = await run.result("d2")
        assert isinstance(refused, proto.Error)
        assert (refused.status, refused.chunks_sent) == (503, 0)  # retryable elsewhere
        done = await run.result("d1")
        assert isinstance(done, proto.Done)
        assert done.completion_tokens == 300
        async with asyncio.timeout(10):
            assert await run.task == 0
        frames = [f for _, f in run.orch.frames]
        assert isinstance(frames[-1], proto.Drained)
        assert frames.index(done) < len(frames) - 1
        assert run.agent.state is AgentState.STOPPED
        assert await run.engine.finished() == 1  # d1 only: d2 never reached the engine


async def test_drain_deadline_hands_off_what_is_left(tmp_path: Path) -> None:
    async with running_agent(tmp_path) as run:
        await run.orch.send(run.assign("slow", endless=True))
        await run.orch.wait_for(lambda _: run.chunks("slow").count("data: ") >= 3)
        await run.orch.send(proto.Drain(deadline_s=0.2))
        handed = await run.result("slow")
        # An `error` the orchestrator resumes elsewhere (not `done(abort)`, a silent truncation),
        # with the usage so far for the settle.
        assert isinstance(handed, proto.Error)
        assert (handed.status, handed.error_type) == (503, "node_draining")
        assert handed.chunks_sent == run.chunks("slow").count("data: ")
        assert handed.completion_tokens == run.chunks("slow").count("data: ") - 1
        async with asyncio.timeout(10):
            assert await run.task == 0
        assert isinstance(run.orch.frames[-1][1], proto.Drained)
        await run.engine.idle()
        assert await run.engine.finished() == 0  # aborted, not run to its end


class _HeldClock:
    """The agent's clock: its sleeps never end by themselves; `sleeping` is set by the first one."""

    def __init__(self) -> None:
        self.sleeping = asyncio.Event()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        self.sleeping.set()
        await asyncio.Event().wait()


async def test_a_drain_at_once_gets_every_handoff_to_the_orchestrator_before_the_socket_closes(
    tmp_path: Path,
) -> None:
    # The orchestrator is slow on the `draining` heartbeat (it writes to PostgreSQL) and runs with
    # handler_cancellation: when the node closes the socket first, whatever it sent after that
    # heartbeat (the handed-off `error`s, `drained`) is never handled, and those reservations stay
    # open. The agent must wait for the orchestrator to close, which it does once it read `drained`.
    stall = asyncio.Event()
    orch = FakeOrchestrator(stall_on_draining=stall, handler_cancellation=True)
    clock = _HeldClock()
    ids = ["h1", "h2", "h3"]
    async with running_agent(tmp_path, orch=orch, deps=AgentDeps(gpu_probe=NoGpuProbe(), clock=clock)) as run:
        for rid in ids:
            await orch.send(run.assign(rid, endless=True))
        await orch.wait_for(lambda _: all(run.chunks(rid).count("data: ") >= 3 for rid in ids))
        run.agent.drain(0.0, reason="handoff")
        # Everything is written; the agent now waits for the orchestrator's close (on its clock),
        # or (before the fix) has closed the socket and stopped.
        sleeping = asyncio.ensure_future(clock.sleeping.wait())
        try:
            await asyncio.wait([sleeping, run.task], timeout=10, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeping.cancel()
        stall.set()
        async with asyncio.timeout(10):
            assert await run.task == 0
    handed = {f.request_id: f for f in orch.of_type(proto.Error)}
    assert sorted(handed) == ids  # before the fix: none reached the orchestrator
    for rid in ids:
        assert (handed[rid].status, handed[rid].error_type) == (503, "node_draining")
        assert handed[rid].chunks_sent == run.chunks(rid).count("data: ")
        assert handed[rid].completion_tokens == run.chunks(rid).count("data: ") - 1  # the role chunk
    assert isinstance(orch.frames[-1][1], proto.Drained)


class _ElapsedClock:
    """The agent's clock: every sleep is over at once (counted)."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)


async def test_an_orchestrator_that_does_not_close_after_drained_is_closed_on_after_a_bound(
    tmp_path: Path,
) -> None:
    orch = FakeOrchestrator(close_on_drained=False)  # an older orchestrator
    clock = _ElapsedClock()
    async with running_agent(tmp_path, orch=orch, deps=AgentDeps(gpu_probe=NoGpuProbe(), clock=clock)) as run:
        run.agent.drain(0.0, reason="sigterm")
        async with asyncio.timeout(10):
            assert await run.task == 0
    assert orch.of_type(proto.Drained) == [proto.Drained(reason="sigterm")]
    assert clock.sleeps == [5.0]  # the bounded wait for the orchestrator's close, then the node closed


class _GatedClock:
    """The agent's clock: its sleeps (the reconnect backoff) last until `gate` is set; `sleeping` is
    set by the first one."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.sleeping = asyncio.Event()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        self.sleeping.set()
        await self.gate.wait()


class _NoJitter:
    """Backoff jitter of 0: the agent dials again at once after a lost connection."""

    def random(self) -> float:
        return 0.0


async def _until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.01)  # polling a condition with a deadline


async def test_lost_connection_aborts_in_flight_and_replays_its_done(tmp_path: Path) -> None:
    # The reconnect waits (on the agent's clock) until the aborted request has reported: the order
    # this test checks is forced, not left to the backoff's jitter (a draw near 0 s on a loaded
    # machine used to re-register while the abort was still reporting: `in_flight == ['cut1']`).
    clock = _GatedClock()
    async with running_agent(tmp_path, deps=AgentDeps(gpu_probe=NoGpuProbe(), clock=clock)) as run:
        await run.orch.send(run.assign("cut1", endless=True))
        await run.orch.wait_for(lambda _: run.chunks("cut1").count("data: ") >= 3)
        await run.orch.cut()
        await run.engine.idle()  # nobody to relay to: stop the GPU work
        assert await run.engine.finished() == 0  # aborted, not run to its end
        async with asyncio.timeout(10):
            await clock.sleeping.wait()  # backing off, not connected
        await _until(lambda: not run.agent.in_flight)  # reported: its done is in the journal
        assert run.orch.connections == 1
        clock.gate.set()
        await run.orch.wait_for(lambda fs: any(c == 2 and isinstance(f, proto.Done) for c, f in fs))
        (done,) = run.orch.of_type(proto.Done, conn=2)
        assert isinstance(done, proto.Done)
        assert done.finish_reason == "abort"
        assert done.completion_tokens >= 2
        assert run.orch.registrations[1].in_flight == []  # aborted before re-registering


async def test_a_reconnect_while_the_abort_still_reports_replays_its_done(tmp_path: Path) -> None:
    # The agent dials again at once: the aborted request may not have reported yet. Either way its
    # `done` reaches the new connection (the journal's replay, or sent live), and a registration
    # that lists it as still in flight is answered `unknown_requests` without losing it.
    async with running_agent(tmp_path, deps=AgentDeps(gpu_probe=NoGpuProbe(), rng=_NoJitter())) as run:
        await run.orch.send(run.assign("cut1", endless=True))
        await run.orch.wait_for(lambda _: run.chunks("cut1").count("data: ") >= 3)
        await run.orch.cut()
        await run.engine.idle()
        assert await run.engine.finished() == 0  # aborted, not run to its end
        await run.orch.wait_for(lambda fs: any(c == 2 and isinstance(f, proto.Done) for c, f in fs))
        assert run.orch.registrations[1].in_flight in ([], ["cut1"])
        dones = run.orch.of_type(proto.Done, conn=2)
        assert {d.request_id for d in dones} == {"cut1"}
        assert len(set(dones)) == 1  # resent (journal replay and live send) maybe, never different
        assert dones[0].finish_reason == "abort"
        assert dones[0].completion_tokens >= 2
        await _until(lambda: not run.agent.journal.pending())  # acknowledged: nothing left to replay


async def test_sigterm_drains_and_exits_zero(tmp_path: Path) -> None:
    orch = FakeOrchestrator()
    async with engine_sim() as engine:
        await orch.start()
        try:
            settings = agent_settings(orch, engine, tmp_path / "j.jsonl", drain_timeout_s=30)
            task = asyncio.create_task(run_agent(settings, AgentDeps(gpu_probe=NoGpuProbe())))
            await orch.wait_for(lambda _: bool(orch.of_type(proto.Heartbeat)))
            await orch.send(proto.Assign(request_id="s1", model=engine.model, body=engine_body(200)))
            await orch.wait_for(lambda _: bool(orch.of_type(proto.Chunk)))
            os.kill(os.getpid(), signal.SIGTERM)
            async with asyncio.timeout(10):
                assert await task == 0
            (done,) = orch.of_type(proto.Done)
            assert isinstance(done, proto.Done)
            assert done.completion_tokens == 200
            drained = orch.of_type(proto.Drained)
            assert drained == [proto.Drained(reason="sigterm")]
        finally:
            await orch.stop()
    # the handler is gone again: a later SIGTERM would not reach a dead agent
    assert signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, signal.default_int_handler, None)


async def test_a_drain_while_registering_ends_the_agent_instead_of_serving(tmp_path: Path) -> None:
    orch = FakeOrchestrator(script=["hold"])
    async with running_agent(tmp_path, orch=orch, wait_registered=False) as run:
        await orch.wait_connections(1)  # the register frame is in; its ack is held back
        run.agent.drain(0.0, reason="sigterm")
        await asyncio.wait_for(run.agent.stopping.wait(), 10)
        orch.release_ack.set()
        assert await asyncio.wait_for(run.task, 10) == 0  # before the fix: served on, never exited
        assert not run.agent.registered.is_set()
