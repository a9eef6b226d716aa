"""enginesim's KV cache events: what the scheduler's prefix cache notes (as vLLM's `BlockPool`), and
the publisher's wire format, bind rule and replay protocol (vLLM's `ZmqEventPublisher`)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
from pydantic import ValidationError

from apps.core.batching.prefix_cache import AllBlocksCleared, BlockRemoved, BlocksStored, block_hashes
from apps.core.batching.scheduler import Scheduler, Sequence
from apps.core.kvwire import engine_binds as is_bind_endpoint
from apps.enginesim.kvevents import END_SEQ, ZmqEventPublisher, make_publisher
from apps.enginesim.profiles import TINY
from apps.enginesim.settings import KvEventsConfig

BS = TINY.block_size  # 16


def _seq(name: str, prompt: list[int], answer: list[int], salt: str | None = None) -> Sequence:
    ids = (*prompt, *answer)
    return Sequence(
        name, len(prompt), len(answer), "length", arrival_s=0.0,
        block_hashes=block_hashes(ids, BS, salt), token_ids=ids, cache_salt=salt,
    )  # fmt: skip


def _run(sched: Scheduler) -> list[Any]:
    events: list[Any] = []
    for _ in range(10_000):
        if not sched.has_work():
            return events
        sched.step()
        events += sched.prefix.take_events()
    raise AssertionError("the scheduler never went idle")


PROMPT = list(range(100, 100 + 3 * BS + 5))  # three full blocks and 5 tokens
ANSWER = list(range(500, 500 + 2 * BS))


def test_prompt_and_answer_blocks_are_stored_as_one_chain_with_their_tokens() -> None:
    sched = Scheduler(TINY, kv_events=True)
    seq = _seq("a", PROMPT, ANSWER)
    sched.add(seq)
    events = _run(sched)
    stored = [e for e in events if isinstance(e, BlocksStored)]
    # The last answer token is never computed: (prompt + answer - 1) // BS full blocks.
    n = (len(PROMPT) + len(ANSWER) - 1) // BS
    assert [h for e in stored for h in e.block_hashes] == list(seq.block_hashes[:n])
    assert [t for e in stored for t in e.token_ids] == (PROMPT + ANSWER)[: n * BS]
    assert stored[0].parent_block_hash is None
    assert len(stored[0].block_hashes) == 3  # the prompt's blocks, at one allocation
    for before, after in itertools.pairwise(stored):
        assert after.parent_block_hash == before.block_hashes[-1]


def test_a_request_sharing_the_prefix_stores_only_its_own_blocks_after_the_shared_ones() -> None:
    sched = Scheduler(TINY, kv_events=True)
    sched.add(_seq("a", PROMPT, ANSWER))
    first = [h for e in _run(sched) if isinstance(e, BlocksStored) for h in e.block_hashes]
    second = _seq("b", [*PROMPT, *ANSWER, *range(900, 900 + BS)], [1])
    sched.add(second)
    stored = [e for e in _run(sched) if isinstance(e, BlocksStored)]
    assert second.num_cached_tokens == len(first) * BS
    assert stored[0].parent_block_hash == first[-1]
    assert not {h for e in stored for h in e.block_hashes} & set(first)


def test_eviction_removes_free_blocks_tail_first_and_a_reset_clears_all() -> None:
    sched = Scheduler(
        TINY.with_overrides(num_blocks=8, max_model_len=7 * BS), kv_events=True
    )  # 7 usable blocks
    sched.add(_seq("a", list(range(1, 1 + 4 * BS)), [1]))
    old = [h for e in _run(sched) if isinstance(e, BlocksStored) for h in e.block_hashes]
    sched.add(_seq("b", list(range(1000, 1000 + 5 * BS)), [1]))
    removed = [e.block_hash for e in _run(sched) if isinstance(e, BlockRemoved)]
    # 5 blocks needed, 3 never used: two of a's are reused, its tail first (freed tail first, as vLLM).
    assert removed == [old[3], old[2]]
    sched.reset_prefix_cache(reset_running=True)
    assert sched.prefix.take_events() == [AllBlocksCleared()]


def test_the_salt_is_the_first_blocks_extra_key_and_events_are_off_by_default() -> None:
    sched = Scheduler(TINY, kv_events=True)
    sched.add(_seq("a", PROMPT, [1], salt="team"))
    stored = [e for e in _run(sched) if isinstance(e, BlocksStored)]
    assert stored[0].first_block_salt == "team"
    plain = Scheduler(TINY)
    plain.add(_seq("a", PROMPT, [1]))
    assert _run(plain) == []


def test_the_config_takes_vllms_keys_and_defaults() -> None:
    config = KvEventsConfig.model_validate_json('{"enable_kv_cache_events": true}')
    assert (config.publisher, config.endpoint, config.topic, config.publishes) == (
        "zmq",
        "tcp://*:5557",
        "",
        True,
    )
    assert KvEventsConfig().publisher == "null"
    assert not KvEventsConfig(enable_kv_cache_events=True, publisher="null").publishes
    assert make_publisher(KvEventsConfig(), BS) is None
    with pytest.raises(ValidationError):
        KvEventsConfig.model_validate_json('{"enable_kv_cache_events": true, "bogus": 1}')


def test_bind_or_connect_as_vllm() -> None:
    assert is_bind_endpoint("tcp://*:5557")
    assert is_bind_endpoint("tcp://[::]:5557")
    assert is_bind_endpoint("ipc:///tmp/x.sock")
    assert not is_bind_endpoint("tcp://127.0.0.1:5557")


@pytest.fixture
def publisher(tmp_path: Path) -> Iterator[tuple[ZmqEventPublisher, str, str]]:
    endpoint, replay = f"ipc://{tmp_path}/ev.sock", f"ipc://{tmp_path}/replay.sock"
    config = KvEventsConfig(
        enable_kv_cache_events=True, endpoint=endpoint, replay_endpoint=replay, topic="kv"
    )
    pub = ZmqEventPublisher(config, BS)
    yield pub, endpoint, replay
    pub.shutdown()


@pytest.mark.timeout(20)
def test_batches_go_out_in_vllms_wire_format_and_replay(
    publisher: tuple[ZmqEventPublisher, str, str],
) -> None:
    pub, _endpoint, replay = publisher
    pub.publish([BlocksStored((7, 8), None, tuple(range(2 * BS)), "s")])
    pub.publish([BlockRemoved(7), AllBlocksCleared()])
    pub.flush()  # both batches sent and buffered: the replay below cannot come before the second
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(replay)
    try:
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        frames = []
        while True:
            assert dealer.poll(10_000), "no replay answer"
            frame = dealer.recv_multipart()
            frames.append(frame)
            if frame[2] == END_SEQ:
                break
    finally:
        dealer.close()
    assert frames[-1] == [b"", b"", END_SEQ, b""]
    assert [(f[1], int.from_bytes(f[2], "big")) for f in frames[:-1]] == [(b"kv", 0), (b"kv", 1)]
    first, second = (msgspec.msgpack.decode(f[3]) for f in frames[:-1])
    assert isinstance(first[0], float)
    assert first[2] == 0
    assert first[1] == [
        {
            "type": "BlockStored", "block_hashes": [7, 8], "parent_block_hash": None,
            "token_ids": list(range(2 * BS)), "block_size": BS, "lora_id": None, "medium": "GPU",
            "lora_name": None, "extra_keys": [["s"], None], "group_idx": 0, "kv_cache_spec_kind": "full_attention",
        }
    ]  # fmt: skip
    assert second[1] == [
        {"type": "BlockRemoved", "block_hashes": [7], "medium": "GPU", "group_idx": 0},
        {"type": "AllBlocksCleared"},
    ]
    assert json.dumps(second)  # plain data: nothing enginesim-specific on the wire
