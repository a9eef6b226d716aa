"""The journal of unacknowledged dones: durable, replayed after a reconnect and after a
restart, forgotten on `done_ack`, compacted."""

from __future__ import annotations

import json
from pathlib import Path

from apps.agent.journal import Journal
from apps.core.protocol import node as proto
from tests.fakes.fake_orchestrator import FakeOrchestrator, running_agent


def _done(rid: str, completion: int = 5) -> proto.Done:
    return proto.Done(request_id=rid, prompt_tokens=10, completion_tokens=completion, finish_reason="stop")


async def test_pending_dones_survive_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    j = Journal(path)
    await j.open()
    await j.record_done(_done("a"))
    await j.record_done(_done("b", 7))
    assert await j.ack("a") is True
    assert await j.ack("a") is False  # duplicate ack
    await j.close()
    again = Journal(path)
    await again.open()
    assert again.pending() == [_done("b", 7)]
    await again.close()


async def test_a_torn_last_line_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    j = Journal(path)
    await j.open()
    await j.record_done(_done("a"))
    await j.close()
    with path.open("a") as f:
        f.write('{"op":"done","frame":{"type":"done","request_id":"tor')  # crash mid-write
    again = Journal(path)
    await again.open()
    assert [d.request_id for d in again.pending()] == ["a"]
    await again.record_done(_done("c"))  # appends still produce readable lines
    await again.close()
    third = Journal(path)
    await third.open()
    assert [d.request_id for d in third.pending()] == ["a", "c"]
    await third.close()


async def test_compaction_keeps_only_pending(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    j = Journal(path, compact_lines=20)
    await j.open()
    for i in range(30):
        await j.record_done(_done(f"r{i}"))
        if i != 13:
            await j.ack(f"r{i}")
    await j.close()
    lines = path.read_text().splitlines()
    assert len(lines) < 20
    assert "r13" in {json.loads(line).get("frame", {}).get("request_id") for line in lines}
    again = Journal(path)
    await again.open()
    assert [d.request_id for d in again.pending()] == ["r13"]
    await again.close()


async def test_unacked_done_is_replayed_after_a_reconnect(tmp_path: Path) -> None:
    orch = FakeOrchestrator(auto_ack_done=False)
    async with running_agent(tmp_path, orch=orch) as run:
        await orch.send(run.assign("j1", 3))
        first = await run.result("j1")
        assert isinstance(first, proto.Done)
        assert run.agent.journal.is_pending("j1")
        orch.auto_ack_done = True
        await orch.cut()
        await orch.wait_for(lambda fs: any(c == 2 and isinstance(f, proto.Done) for c, f in fs))
        replayed = [f for f in orch.of_type(proto.Done, conn=2)]
        assert replayed == [first]
        await orch.wait_for(lambda _: not run.agent.journal.pending())


async def test_restart_with_unacked_dones_replays_each_once(tmp_path: Path) -> None:
    orch1 = FakeOrchestrator(auto_ack_done=False)
    async with running_agent(tmp_path, orch=orch1, drain_ack_wait_s=0.0) as run:
        for rid in ("x1", "x2"):
            await orch1.send(run.assign(rid, 2))
            await run.result(rid)
    # agent 1 has exited (drained) with two dones never acknowledged
    pending = Journal(tmp_path / "journal.jsonl")
    await pending.open()
    assert [d.request_id for d in pending.pending()] == ["x1", "x2"]
    await pending.close()

    orch2 = FakeOrchestrator(auto_ack_done=True)
    async with running_agent(tmp_path, orch=orch2, done_resend_s=0.05) as run2:
        await orch2.wait_for(lambda _: not run2.agent.journal.pending())
        replayed = orch2.of_type(proto.Done)
        assert sorted(d.request_id for d in replayed) == ["x1", "x2"]  # once each
        # Acked: a few resend intervals later, still nothing more (waiting on heartbeats, not time).
        beats = len(orch2.of_type(proto.Heartbeat))
        await orch2.wait_for(lambda _: len(orch2.of_type(proto.Heartbeat)) >= beats + 5)
        assert len(orch2.of_type(proto.Done)) == 2
    final = Journal(tmp_path / "journal.jsonl")
    await final.open()
    assert final.pending() == []
    await final.close()


async def test_unacked_done_is_resent_on_a_live_connection(tmp_path: Path) -> None:
    orch = FakeOrchestrator(auto_ack_done=False)
    async with running_agent(tmp_path, orch=orch, done_resend_s=0.1) as run:
        await orch.send(run.assign("z1", 1))
        await run.result("z1")
        await orch.wait_for(lambda _: len(orch.of_type(proto.Done)) >= 2)  # repeated until acked
        await orch.send(proto.DoneAck(request_id="z1"))
        await orch.wait_for(lambda _: not run.agent.journal.pending())


async def test_concurrent_dones_are_group_committed_and_all_durable(tmp_path: Path) -> None:
    import asyncio

    path = tmp_path / "j.jsonl"
    j = Journal(path)
    await j.open()
    await asyncio.gather(*(j.record_done(_done(f"g{i}")) for i in range(50)))
    await asyncio.gather(*(j.ack(f"g{i}") for i in range(0, 50, 2)))
    await j.close()
    again = Journal(path)
    await again.open()
    assert [d.request_id for d in again.pending()] == [f"g{i}" for i in range(1, 50, 2)]
    await again.close()


async def test_an_ack_waits_for_the_next_write_and_a_lost_ack_costs_one_replay(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    j = Journal(path)
    await j.open()
    await j.record_done(_done("a"))
    written = path.read_bytes()
    assert await j.ack("a") is True
    assert path.read_bytes() == written  # acknowledging never waits for the disk
    # A crash now loses the ack: the journal replays "a" once more (the settle is idempotent).
    crashed = Journal(path)
    await crashed.open()
    assert [d.request_id for d in crashed.pending()] == ["a"]
    await crashed.close()
    await j.record_done(_done("b"))  # the ack rides along with the next done
    again = Journal(path)
    await again.open()
    assert [d.request_id for d in again.pending()] == ["b"]
    await again.close()
    await j.close()
