"""The agent's side of the orchestrator socket handover (protocol version 3): on `handover` it
registers on the next orchestrator, takes new work there, and finishes the requests that came on
the old socket on that socket; at the deadline what still runs there ends with a `node_draining`
error carrying the exact tokens produced. Fake engine and fake orchestrators (real sockets)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from apps.agent.deps import AgentState
from apps.core.protocol import node as proto
from tests.fakes.fake_orchestrator import FakeOrchestrator, running_agent


async def _result_on(orch: FakeOrchestrator, request_id: str) -> proto.Done | proto.Error:
    def has(frames: list[tuple[int, proto.NodeFrame]]) -> bool:
        return any(isinstance(f, proto.Done | proto.Error) and f.request_id == request_id for _, f in frames)

    await orch.wait_for(has, 10)
    return next(
        f for _, f in orch.frames if isinstance(f, proto.Done | proto.Error) and f.request_id == request_id
    )


def _content_events(delta: str) -> int:
    """Content-bearing SSE events (the role chunk's empty content is not a token)."""
    return sum(1 for event in delta.split("\n\n") if '"content":"' in event and '"content":""' not in event)


async def test_handover_moves_new_work_and_keeps_the_running_request_on_the_old_socket(
    tmp_path: Path,
) -> None:
    old = FakeOrchestrator(orchestrator_id="orch-a")
    new = FakeOrchestrator(orchestrator_id="orch-b")
    # enginesim at 20 tokens/s: r1 (20 tokens) runs about a second, across the handover
    async with running_agent(tmp_path, orch=old, more=(new,), engine_speed=0.02) as run:
        await old.send(run.assign("r1", 20))
        await old.wait_for(lambda fs: any(isinstance(f, proto.Chunk) for _, f in fs))
        await old.send(proto.Handover(deadline_s=30))
        await new.wait_connections(1)
        # The new registration does not claim r1: it stays with the socket it came on.
        assert new.registrations[0].in_flight == []
        assert new.registrations[0].version == proto.PROTOCOL_VERSION
        await old.wait_for(lambda fs: any(isinstance(f, proto.HandedOver) for _, f in fs))
        handed = old.of_type(proto.HandedOver)[0]
        assert handed.orchestrator_id == "orch-b"
        assert handed.in_flight == ["r1"]
        # New work on the new socket while r1 still runs on the old one.
        await new.send(run.assign("r2", 3))
        r2 = await _result_on(new, "r2")
        assert isinstance(r2, proto.Done)
        assert r2.completion_tokens == 3
        r1 = await run.result("r1")
        assert isinstance(r1, proto.Done)
        assert r1.completion_tokens == 20
        assert _content_events(run.chunks("r1")) == 20  # every chunk on the old socket
        assert not any(getattr(f, "request_id", None) == "r1" for _, f in new.frames)
        # The old socket carries no heartbeats after the handover; the new one does.
        beats_before = len(old.of_type(proto.Heartbeat))
        await new.wait_for(lambda fs: sum(isinstance(f, proto.Heartbeat) for _, f in fs) >= 3)
        assert len(old.of_type(proto.Heartbeat)) == beats_before
        # The old replica closes it as handed over: the agent stays registered on the new one.
        await old.close_socket(proto.CLOSE_HANDED_OVER)
        await new.send(run.assign("r3", 2))
        r3 = await _result_on(new, "r3")
        assert isinstance(r3, proto.Done)
        assert run.agent.state is AgentState.READY
        assert new.connections == 1
        assert old.connections == 1


async def test_at_the_handover_deadline_a_running_request_ends_with_node_draining_and_its_tokens(
    tmp_path: Path,
) -> None:
    old = FakeOrchestrator(orchestrator_id="orch-a")
    new = FakeOrchestrator(orchestrator_id="orch-b")
    async with running_agent(tmp_path, orch=old, more=(new,)) as run:
        await old.send(run.assign("long", endless=True))
        await old.wait_for(lambda fs: _content_events(run.chunks("long")) >= 3)
        await old.send(proto.Handover(deadline_s=0.3))
        result = await run.result("long")
        assert isinstance(result, proto.Error)
        assert result.error_type == "node_draining"
        assert result.status == 503
        # Exactly the tokens the node forwarded (the engine's running count), none made up.
        assert result.completion_tokens == _content_events(run.chunks("long")) > 0
        assert result.chunks_sent > 0
        await new.wait_connections(1)
        assert run.agent.registered.is_set()


async def test_a_refused_new_registration_moves_on_and_the_old_socket_keeps_serving(tmp_path: Path) -> None:
    """The next URL refuses, and so does the stopping replica itself (it takes no registrations):
    the agent goes on trying, the URLs in turn, while the old socket finishes its request."""
    stopping = proto.RegisterRefused(reason="orchestrator_stopping", retry_after_s=0.01)
    old = FakeOrchestrator(orchestrator_id="orch-a", script=["ack", stopping])
    new = FakeOrchestrator(orchestrator_id="orch-b", script=[stopping, "ack"])
    async with running_agent(tmp_path, orch=old, more=(new,), backoff_base_s=0.05, engine_speed=0.02) as run:
        await old.send(run.assign("r1", 10))
        await old.send(proto.Handover(deadline_s=30))
        await new.wait_connections(2)
        async with asyncio.timeout(10):
            await run.agent.registered.wait()
        assert run.agent.orchestrator_id == "orch-b"
        assert old.connections == 2  # the refused attempt in between went to the other URL
        r1 = await run.result("r1")
        assert isinstance(r1, proto.Done)
        assert r1.completion_tokens == 10
