"""The agent's KV events forwarder (apps/agent/kvforward.py) against enginesim's publisher (vLLM's
wire format and replay protocol) on ipc endpoints, and the orchestrator's prefix index
(apps/orchestrator/prefix_index.py) fed with what it forwards."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from apps.agent.kvforward import KvForwarder
from apps.core.batching.prefix_cache import AllBlocksCleared, BlockRemoved, BlocksStored, block_hashes
from apps.core.protocol import node as proto
from apps.core.scheduling.prefix import block_keys
from apps.enginesim.kvevents import ZmqEventPublisher
from apps.enginesim.settings import KvEventsConfig
from apps.orchestrator.prefix_index import PrefixIndex

pytestmark = pytest.mark.timeout(30)
BS = 4
PROMPT = list(range(100, 100 + 3 * BS))  # three full blocks
HASHES = block_hashes(PROMPT, BS)


class Sent:
    """The connection's `send`: every frame, and a wake-up for each."""

    def __init__(self) -> None:
        self.frames: list[proto._Frame] = []
        self.arrived = asyncio.Event()

    async def __call__(self, frame: proto._Frame) -> bool:
        self.frames.append(frame)
        self.arrived.set()
        return True

    async def until(self, n: int) -> list[proto._Frame]:
        async with asyncio.timeout(10):
            while len(self.frames) < n:
                self.arrived.clear()
                await self.arrived.wait()
        return self.frames


@contextlib.contextmanager
def publisher(tmp_path: Path, name: str = "kv", buffer_steps: int = 10_000) -> Iterator[ZmqEventPublisher]:
    config = KvEventsConfig(
        enable_kv_cache_events=True,
        endpoint=f"ipc://{tmp_path}/{name}.pub",
        replay_endpoint=f"ipc://{tmp_path}/{name}.replay",
        buffer_steps=buffer_steps,
    )
    pub = ZmqEventPublisher(config, BS)
    try:
        yield pub
    finally:
        pub.shutdown()


@contextlib.asynccontextmanager
async def forwarding(forwarder: KvForwarder) -> AsyncIterator[None]:
    task = asyncio.create_task(forwarder.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _stored(first: int, n: int) -> BlocksStored:
    parent = None if first == 0 else HASHES[first - 1]
    tokens = tuple(PROMPT[first * BS : (first + n) * BS])
    return BlocksStored(HASHES[first : first + n], parent, tokens)


async def test_a_new_connection_gets_the_history_replayed_then_the_live_batches(tmp_path: Path) -> None:
    with publisher(tmp_path) as pub:
        pub.publish([_stored(0, 2)])  # before the agent subscribed: only the replay has it
        pub.flush()
        forwarder = KvForwarder("m", pub_endpoint(tmp_path), replay_endpoint(tmp_path))
        sent = Sent()
        async with forwarding(forwarder):
            await forwarder.connected(sent)
            frames = await sent.until(2)
            assert frames[0] == proto.KvReset(model="m", reason="connected")
            assert isinstance(frames[1], proto.KvEvents)
            assert frames[1].seq == 0
            # Live: the subscription may not be live yet when the first is published, so publish
            # until one arrives; whatever PUB/SUB dropped before comes from the replay, in order.
            seq = 1
            while not any(isinstance(f, proto.KvEvents) and f.seq >= 1 for f in sent.frames):
                pub.publish([BlockRemoved(HASHES[1])] if seq == 1 else [])
                pub.flush()
                seq += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(sent.until(len(sent.frames) + 1), 0.2)
        events = [f for f in sent.frames if isinstance(f, proto.KvEvents)]
        assert [f.seq for f in events] == list(range(len(events)))  # in order, none twice, none missing

    index = PrefixIndex()
    for f in events:
        index.apply("n1", f)
    keys = block_keys(PROMPT, BS)
    assert index.matched("n1", "m", keys) == 1  # block 0 stored; block 1 stored then evicted


async def test_an_engine_restart_resets_the_index(tmp_path: Path) -> None:
    sent = Sent()
    forwarder = KvForwarder("m", pub_endpoint(tmp_path), replay_endpoint(tmp_path))
    with publisher(tmp_path) as pub:
        for first in range(3):  # seq 0-2
            pub.publish([_stored(first, 1)])
        pub.flush()
        async with forwarding(forwarder):
            await forwarder.connected(sent)
            await sent.until(4)
    # The engine started again, its numbering from 0: whichever of its first three batches arrives
    # first (PUB/SUB may drop some while the subscription joins) is below the next one expected.
    with publisher(tmp_path) as again:
        async with forwarding(forwarder):
            n = len(sent.frames)
            while not any(isinstance(f, proto.KvReset) and f.reason == "engine_restart" for f in sent.frames):
                again.publish([AllBlocksCleared()])
                again.flush()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(sent.until(n + 1), 0.2)
    restarted = next(
        i for i, f in enumerate(sent.frames) if isinstance(f, proto.KvReset) and f.reason == "engine_restart"
    )
    after = [f.seq for f in sent.frames[restarted:] if isinstance(f, proto.KvEvents)]
    assert after == list(range(len(after)))  # the new engine's batches from 0, its buffer filling the hole


@pytest.mark.parametrize(("buffer_steps", "reset"), [(10_000, False), (2, True)], ids=["replayed", "too-old"])
async def test_a_gap_is_filled_from_the_replay_buffer_or_resets_the_index(
    tmp_path: Path, buffer_steps: int, reset: bool
) -> None:
    """Batches 1-3 never arrived live (PUB/SUB dropped them); batch 4 does. The forwarder asks the
    engine's buffer for 1-3 and sends them first; a buffer that kept only 3-4 cannot fill the hole,
    and the orchestrator is told to forget the index (`kv_reset gap`) before what follows."""
    sent = Sent()
    forwarder = KvForwarder("m", pub_endpoint(tmp_path), replay_endpoint(tmp_path))
    with publisher(tmp_path, buffer_steps=buffer_steps) as pub:
        pub.publish([_stored(0, 1)])  # seq 0
        pub.flush()
        await forwarder.connected(sent)  # replays 0 (the "too-old" buffer still has it)
        for first in (1, 2):
            pub.publish([_stored(first, 1)])  # seq 1, 2
        pub.publish([AllBlocksCleared()])  # seq 3
        pub.publish([])  # seq 4, the one that arrives live
        pub.flush()
        live = pub._buffer[-1]
        await forwarder._live(*live)
    events = [f.seq for f in sent.frames if isinstance(f, proto.KvEvents)]
    gaps = [f for f in sent.frames if isinstance(f, proto.KvReset) and f.reason == "gap"]
    if reset:
        assert events == [0, 3, 4]  # 1-2 were gone from the buffer
        assert len(gaps) == 1
        assert sent.frames.index(gaps[0]) < [getattr(f, "seq", -1) for f in sent.frames].index(3)
    else:
        assert events == [0, 1, 2, 3, 4]
        assert gaps == []


async def test_on_loopback_tcp_the_engine_connects_and_the_agent_binds(tmp_path: Path) -> None:
    """vLLM connects its PUB socket to `tcp://127.0.0.1:port` (it binds only wildcard and ipc
    endpoints): the agent's SUB binds it, on loopback only. The replay socket the engine binds."""
    pub_port, replay_port = _free_port(), _free_port()
    config = KvEventsConfig(
        enable_kv_cache_events=True,
        endpoint=f"tcp://127.0.0.1:{pub_port}",
        replay_endpoint=f"tcp://127.0.0.1:{replay_port}",
    )
    forwarder = KvForwarder("m", config.endpoint, config.replay_endpoint)
    sent = Sent()
    pub = ZmqEventPublisher(config, BS)
    try:
        async with forwarding(forwarder):
            await forwarder.connected(sent)
            seq = 0
            while not any(isinstance(f, proto.KvEvents) for f in sent.frames):
                pub.publish([_stored(0, 1)] if seq == 0 else [])
                pub.flush()
                seq += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(sent.until(len(sent.frames) + 1), 0.2)
    finally:
        pub.shutdown()
    events = [f for f in sent.frames if isinstance(f, proto.KvEvents)]
    assert events[0].seq == 0  # the first batch, live or from the replay


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pub_endpoint(tmp_path: Path) -> str:
    return f"ipc://{tmp_path}/kv.pub"


def replay_endpoint(tmp_path: Path) -> str:
    return f"ipc://{tmp_path}/kv.replay"


def test_the_index_keys_blocks_by_their_tokens_not_by_the_engines_hash() -> None:
    index = PrefixIndex()
    stored = proto.KvStoredOp(hashes=[11, 12], parent=None, tokens=PROMPT[: 2 * BS], block_size=BS)
    child = proto.KvStoredOp(hashes=[13], parent=12, tokens=PROMPT[2 * BS :], block_size=BS)
    index.apply("n1", proto.KvEvents(model="m", seq=0, events=[stored, child]))
    keys = block_keys(PROMPT, BS)
    assert index.matched("n1", "m", keys) == 3
    assert index.matched("n1", "m", block_keys([1, *PROMPT[1:]], BS)) == 0  # another first block
    index.apply("n1", proto.KvEvents(model="m", seq=1, events=[proto.KvRemovedOp(hashes=[12])]))
    assert index.matched("n1", "m", keys) == 1  # block 2 is held but unreachable without block 1
    orphan = proto.KvStoredOp(hashes=[99], parent=4242, tokens=PROMPT[:BS], block_size=BS)
    index.apply("n1", proto.KvEvents(model="m", seq=2, events=[orphan]))
    engine = index.engine("n1", "m")
    assert engine is not None
    assert engine.unkeyed == 1  # its parent was never seen: left out
    index.apply("n1", proto.KvEvents(model="m", seq=2, events=[proto.KvClearedOp()]))
    assert index.matched("n1", "m", keys) == 1  # seq 2 again: already applied, ignored
    index.forget("n1")
    assert index.matched("n1", "m", keys) == 0


def test_an_announcement_must_name_a_block_the_engine_stored_at_the_depth_it_claims() -> None:
    index = PrefixIndex()
    stored = proto.KvStoredOp(hashes=[11, 12, 13], parent=None, tokens=PROMPT, block_size=BS)
    index.apply("n1", proto.KvEvents(model="m", seq=0, events=[stored]))
    keys = block_keys(PROMPT, BS)

    def announce(block: bytes, blocks: int) -> bool:
        return index.announce("n1", proto.KvPrefix(model="m", key="a" * 32, block=block.hex(), blocks=blocks))

    assert announce(keys[2], 3)
    assert not announce(keys[2], 40)  # a depth the engine never stored: would outbid honest nodes
    assert not announce(bytes(16), 1)  # a block its events never stored
    gone = index.apply("n1", proto.KvEvents(model="m", seq=1, events=[proto.KvRemovedOp(hashes=[13])]))
    assert gone == ["a" * 32]  # the announcement goes with its last block


async def test_a_restart_whose_first_batches_were_all_missed_is_still_seen(tmp_path: Path) -> None:
    """The old engine sent 0-2; the new one's 0-3 never arrived live, its 4 does (no number went back).
    The catch-up asks the new engine's buffer for 2 as well: another batch under that number means a
    restart, so the index is reset and the new engine's batches go from 0."""
    sent = Sent()
    forwarder = KvForwarder("m", pub_endpoint(tmp_path), replay_endpoint(tmp_path))
    with publisher(tmp_path) as old:
        for first in range(3):
            old.publish([_stored(first, 1)])
        old.flush()
        await forwarder.connected(sent)
    assert forwarder.next_seq == 3
    with publisher(tmp_path) as new:
        new.publish([AllBlocksCleared()])  # seq 0: differs from the old engine's 0
        for _ in range(4):
            new.publish([BlockRemoved(HASHES[0])])  # seq 1-4
        new.flush()
        await forwarder._live(*new._buffer[-1])
    restart = next(
        i for i, f in enumerate(sent.frames) if isinstance(f, proto.KvReset) and f.reason == "engine_restart"
    )
    after = [f.seq for f in sent.frames[restart:] if isinstance(f, proto.KvEvents)]
    assert after == [0, 1, 2, 3, 4]


def test_only_the_gpus_first_cache_group_is_forwarded() -> None:
    from apps.agent.kvforward import as_frame
    from apps.core.kvwire import BlockRemoved as WireRemoved
    from apps.core.kvwire import BlockStored as WireStored
    from apps.core.kvwire import KVEventBatch

    def stored(medium: str | None, group: int | None) -> WireStored:
        return WireStored(
            block_hashes=[1], parent_block_hash=None, token_ids=PROMPT[:BS], block_size=BS,
            lora_id=None, medium=medium, lora_name=None, group_idx=group,
        )  # fmt: skip

    batch = KVEventBatch(
        ts=0.0,
        events=[stored("GPU", 0), stored("CPU", 0), stored("GPU", 1), stored(None, None),
                WireRemoved(block_hashes=[1], medium="CPU")],
    )  # fmt: skip
    frame = as_frame("m", 0, batch)
    assert [type(op).__name__ for op in frame.events] == ["KvStoredOp", "KvStoredOp"]


def _index_of(frames: list[proto._Frame]) -> PrefixIndex:
    """The orchestrator's index of node n1 after `frames`, as `PrefixFeed` applies them."""
    index = PrefixIndex()
    for f in frames:
        if isinstance(f, proto.KvReset):
            index.reset("n1", f.model)
        elif isinstance(f, proto.KvEvents):
            index.apply("n1", f)
    return index


async def test_an_engine_that_stops_answering_is_forgotten_at_once_and_rebuilt_if_it_was_only_slow(
    tmp_path: Path,
) -> None:
    sent = Sent()
    forwarder = KvForwarder("m", pub_endpoint(tmp_path), replay_endpoint(tmp_path))
    with publisher(tmp_path) as pub:
        for first in range(2):
            pub.publish([_stored(first, 1)])  # seq 0-1
        pub.flush()
        await forwarder.connected(sent)  # replays 0-1
        assert _index_of(sent.frames).matched("n1", "m", block_keys(PROMPT, BS)) == 2
        await forwarder.engine_down()  # the heartbeat found the engine down
        await forwarder.engine_down()  # and again: nothing new to forget
        downs = [f for f in sent.frames if isinstance(f, proto.KvReset) and f.reason == "engine_down"]
        assert len(downs) == 1
        assert _index_of(sent.frames).matched("n1", "m", block_keys(PROMPT, BS)) == 0
        # It was only slow: its next batch comes after its history, replayed from its buffer.
        pub.publish([_stored(2, 1)])  # seq 2
        pub.flush()
        await forwarder._live(*pub._buffer[-1])
    after = sent.frames[sent.frames.index(downs[0]) :]
    assert [f.seq for f in after if isinstance(f, proto.KvEvents)] == [0, 1, 2]
    assert _index_of(sent.frames).matched("n1", "m", block_keys(PROMPT, BS)) == 3


async def test_after_an_engine_went_down_its_successors_batches_are_taken_from_0(tmp_path: Path) -> None:
    sent = Sent()
    forwarder = KvForwarder("m", pub_endpoint(tmp_path), replay_endpoint(tmp_path))
    with publisher(tmp_path) as pub:
        for first in range(3):
            pub.publish([_stored(first, 1)])  # seq 0-2
        pub.flush()
        await forwarder.connected(sent)
    await forwarder.engine_down()
    with publisher(tmp_path) as again:  # a new engine: its numbering starts over, its cache is empty
        again.publish([_stored(0, 1)])  # seq 0
        again.flush()
        await forwarder._live(*again._buffer[-1])
    down = next(
        i for i, f in enumerate(sent.frames) if isinstance(f, proto.KvReset) and f.reason == "engine_down"
    )
    after = sent.frames[down + 1 :]
    assert [type(f).__name__ for f in after] == ["KvEvents"]  # no restart to detect: it was forgotten
    assert _index_of(sent.frames).matched("n1", "m", block_keys(PROMPT, BS)) == 1


def test_an_engines_index_is_bounded_whatever_its_node_sends(monkeypatch: pytest.MonkeyPatch) -> None:
    from apps.orchestrator import prefix_index

    monkeypatch.setattr(prefix_index, "MAX_BLOCKS", 4)
    monkeypatch.setattr(prefix_index, "MAX_ANNOUNCED", 2)
    index = PrefixIndex()
    stored = proto.KvStoredOp(hashes=list(HASHES), parent=None, tokens=PROMPT, block_size=BS)
    index.apply("n1", proto.KvEvents(model="m", seq=0, events=[stored]))
    last = block_keys(PROMPT, BS)[-1].hex()
    for n, prefix in enumerate(("1" * 32, "2" * 32, "3" * 32)):
        kept = index.announce("n1", proto.KvPrefix(model="m", key=prefix, block=last, blocks=3))
        assert kept == (n < 2)  # the third is refused: two announcements at most
    # More blocks than any engine holds: the index starts again, its announcements retracted.
    more = proto.KvStoredOp(
        hashes=[h + 1000 for h in HASHES], parent=HASHES[-1], tokens=[t + 1 for t in PROMPT], block_size=BS
    )
    gone = index.apply("n1", proto.KvEvents(model="m", seq=1, events=[more]))
    assert sorted(gone) == ["1" * 32, "2" * 32]
    assert index.overflows == 1
    assert index.matched("n1", "m", block_keys(PROMPT, BS)) == 0
    assert index.apply("n1", proto.KvEvents(model="m", seq=1, events=[stored])) == []  # seq 1 was applied
