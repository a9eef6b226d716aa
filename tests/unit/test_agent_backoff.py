"""Reconnect backoff: exponential with full jitter, capped at 60 s, reset only after
`register_ack`, with `retry_after_s` honoured. Clock and random source are injected:
nothing here sleeps."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from apps.agent.backoff import Backoff
from apps.agent.deps import AgentDeps
from apps.agent.telemetry import NoGpuProbe
from apps.core.protocol import node as proto
from tests.fakes.fake_orchestrator import FakeOrchestrator, running_agent


class FixedRandom:
    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


class RecordingClock:
    """Sleeps take no time; every requested delay is recorded."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


def test_full_jitter_doubles_the_window_up_to_the_cap() -> None:
    top = Backoff(FixedRandom(0.999999), base_s=1.0, cap_s=60.0)
    windows = [round(top.next_delay(), 3) for _ in range(9)]
    assert windows == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]
    half = Backoff(FixedRandom(0.5))
    assert [half.next_delay() for _ in range(4)] == [0.5, 1.0, 2.0, 4.0]
    assert Backoff(FixedRandom(0.0)).next_delay() == 0.0  # full jitter reaches down to zero


def test_reset_and_retry_after_floor() -> None:
    b = Backoff(FixedRandom(0.5))
    for _ in range(5):
        b.next_delay()
    b.reset()
    assert b.attempt == 0
    assert b.next_delay() == 0.5
    assert b.next_delay(retry_after_s=7.0) == 7.0 + 0.5 * 2.0  # a floor, plus jitter
    assert b.next_delay(retry_after_s=None) == 2.0


def test_a_long_outage_does_not_overflow() -> None:
    b = Backoff(FixedRandom(0.5), cap_s=60.0)
    for _ in range(10_000):
        delay = b.next_delay()
    assert delay == 30.0


def test_jitter_spreads_reconnects() -> None:
    import random

    rng = random.Random(7)
    delays = [Backoff(rng).next_delay() for _ in range(1000)]
    assert 0.0 <= min(delays) < 0.01
    assert 0.99 < max(delays) <= 1.0
    buckets = [sum(1 for d in delays if i / 10 <= d < (i + 1) / 10) for i in range(10)]
    assert min(buckets) > 60  # roughly uniform over [0, 1): no synchronized wave


async def test_agent_backs_off_honours_retry_after_and_resets_only_after_ack(tmp_path: Path) -> None:
    clock = RecordingClock()
    orch = FakeOrchestrator(
        script=[
            ("close", proto.CLOSE_REGISTRATION_REFUSED),
            proto.RegisterRefused(reason="rate limited", retry_after_s=7.0),
            ("close", proto.CLOSE_AUTH_FAILED),
            "ack",
        ]
    )
    deps = AgentDeps(clock=clock, rng=FixedRandom(0.5), gpu_probe=NoGpuProbe())
    async with running_agent(tmp_path, orch=orch, deps=deps) as run:
        assert orch.connections == 4
        assert clock.sleeps == [0.5, 7.0 + 1.0, 2.0]  # attempts 0, 1 (+retry_after), 2
        assert run.agent.backoff.attempt == 0  # reset by the ack
        await orch.cut()
        await orch.wait_connections(5)
        assert clock.sleeps[3] == 0.5  # the first delay again after a successful session
        async with asyncio.timeout(10):
            await run.agent.registered.wait()
        regs = orch.registrations
        assert all(r.version == proto.PROTOCOL_VERSION and r.token == "nt-test" for r in regs)
        assert regs[0].models[0].max_num_seqs == 8
        assert regs[0].models[0].max_model_len == 1024  # what the engine (enginesim tiny) reports


@pytest.mark.parametrize(
    "code", [proto.CLOSE_UNSUPPORTED_VERSION, proto.CLOSE_REVOKED, proto.CLOSE_SUPERSEDED]
)
async def test_refusal_close_codes_back_off_and_retry(tmp_path: Path, code: int) -> None:
    clock = RecordingClock()
    orch = FakeOrchestrator(script=[("close", code), ("close", code)])
    deps = AgentDeps(clock=clock, rng=FixedRandom(1.0 - 1e-9), gpu_probe=NoGpuProbe())
    async with running_agent(tmp_path, orch=orch, deps=deps) as run:
        assert [round(s, 3) for s in clock.sleeps] == [1.0, 2.0]
        assert run.agent.ready()


async def test_an_older_orchestrator_gets_a_lower_version_and_the_newest_is_tried_again_later(
    tmp_path: Path,
) -> None:
    """One version down per 4001 (7 -> 6 -> ... -> 1), the newest again on the next connection."""
    clock = RecordingClock()
    unsupported = ("close", proto.CLOSE_UNSUPPORTED_VERSION)
    orch = FakeOrchestrator(script=[*[unsupported] * 6, "ack", "ack"])
    deps = AgentDeps(clock=clock, rng=FixedRandom(0.5), gpu_probe=NoGpuProbe())
    async with running_agent(tmp_path, orch=orch, deps=deps, model_revision="rev-a") as run:
        assert [r.version for r in orch.registrations] == [proto.PROTOCOL_VERSION, 6, 5, 4, 3, 2, 1]
        # A version 1-5 register carries no revision (an older orchestrator refuses unknown fields).
        assert [r.models[0].revision for r in orch.registrations] == ["rev-a", "rev-a", "", "", "", "", ""]
        for rid in ("v1a", "v1b"):
            await orch.send(run.assign(rid, 4))
        for rid in ("v1a", "v1b"):
            await run.result(rid)
        # Version 1 has no batched messages: every message of that connection held one frame.
        assert {n for conn, n in orch.message_sizes if conn == 7} == {1}
        await orch.cut()
        await orch.wait_connections(8)
        assert orch.registrations[7].version == proto.PROTOCOL_VERSION


async def test_a_version_2_orchestrator_gets_version_2(tmp_path: Path) -> None:
    """An orchestrator from before the handover (versions 1-2) refuses 7, 6, 5, 4 and 3: the agent speaks 2
    to it (and gets the engine's body built, as such an orchestrator sends it)."""
    unsupported = ("close", proto.CLOSE_UNSUPPORTED_VERSION)
    orch = FakeOrchestrator(script=[*[unsupported] * 5, "ack"])
    deps = AgentDeps(clock=RecordingClock(), rng=FixedRandom(0.5), gpu_probe=NoGpuProbe())
    async with running_agent(tmp_path, orch=orch, deps=deps) as run:
        assert [r.version for r in orch.registrations] == [proto.PROTOCOL_VERSION, 6, 5, 4, 3, 2]
        await orch.send(run.assign("v2", 4))
        done = await run.result("v2")
        assert isinstance(done, proto.Done)
        assert done.completion_tokens == 4
