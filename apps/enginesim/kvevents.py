"""KV cache events published as vLLM 0.32 publishes them (`--kv-events-config`).

The wire format is vLLM's (`vllm/distributed/kv_events.py`, its `ZmqEventPublisher`): each engine
step with events is one ZMQ PUB message of three frames, the topic, an 8-byte big-endian sequence
number (from 0, no gaps) and a msgpack payload encoded by msgspec from the same structs vLLM uses:
an `EventBatch` array `[ts, events, data_parallel_rank]` (rank 0), each event a map tagged `"type"`
(`BlockStored`, `BlockRemoved`, `AllBlocksCleared`) with vLLM's fields, defaults omitted. The
values follow vLLM's `BlockPool` and `KVCacheManager.take_events`: medium "GPU" (on CPU too), group
0, `kv_cache_spec_kind` "full_attention" on stores, no LoRA, `extra_keys` one entry per block (the
cache salt for a request's first block, else None).

What the events say comes from the scheduler's prefix cache (`apps/core/batching/prefix_cache.py`).
The engine loop only hands each step's events to a queue (`publish` never blocks: a full queue
drops the batch and logs it); a thread encodes and sends them, and answers replay requests on the
ROUTER socket (`replay_endpoint`): a request `[client_id, b"", start_seq]` gets every buffered
batch from `start_seq` as `[client_id, b"", topic, seq, payload]`, then `[client_id, b"", b"",
END_SEQ, b""]` (END_SEQ: -1 as 8 signed big-endian bytes).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence
from itertools import count
from typing import Any

import msgspec
import zmq

from apps.core.batching.prefix_cache import AllBlocksCleared as CoreCleared
from apps.core.batching.prefix_cache import BlockRemoved as CoreRemoved
from apps.core.batching.prefix_cache import KvEvent
from apps.core.kvwire import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVCacheEvent,
    engine_binds,
)
from apps.enginesim.settings import KvEventsConfig

log = logging.getLogger("llmfleet.enginesim")

MEDIUM_GPU = "GPU"
FULL_ATTENTION = "full_attention"  # vLLM's KVCacheSpecKind of a plain decoder's KV cache group
POLL_S = 0.1  # how often the publisher thread looks at the replay socket when idle


def wire_events(events: Sequence[KvEvent], block_size: int) -> list[KVCacheEvent]:
    """The scheduler's events as vLLM's structs (what `BlockPool` puts in its queue)."""
    out: list[KVCacheEvent] = []
    for ev in events:
        if isinstance(ev, CoreRemoved):
            removed: list[int | bytes] = [ev.block_hash]
            out.append(BlockRemoved(block_hashes=removed, medium=MEDIUM_GPU, group_idx=0))
        elif isinstance(ev, CoreCleared):
            out.append(AllBlocksCleared())
        else:
            salt = ev.first_block_salt
            keys: list[tuple[Any, ...] | None] = [None] * len(ev.block_hashes)
            if salt:
                keys[0] = (salt,)
            stored: list[int | bytes] = list(ev.block_hashes)
            out.append(
                BlockStored(
                    block_hashes=stored,
                    parent_block_hash=ev.parent_block_hash,
                    token_ids=list(ev.token_ids),
                    block_size=block_size,
                    lora_id=None,
                    medium=MEDIUM_GPU,
                    lora_name=None,
                    extra_keys=keys,
                    group_idx=0,
                    kv_cache_spec_kind=FULL_ATTENTION,  # vLLM's KVCacheManager annotates each store
                )
            )
    return out


class ZmqEventPublisher:
    """vLLM's publisher: a PUB socket (and an optional ROUTER for replay) served by one thread."""

    def __init__(self, config: KvEventsConfig, block_size: int) -> None:
        self.block_size = block_size
        self.dropped = 0  # batches dropped because the queue was full
        self._queue: queue.Queue[tuple[float, Sequence[KvEvent]] | None] = queue.Queue(config.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._topic = config.topic.encode()
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._pub = ctx.socket(zmq.PUB)
        self._replay: zmq.Socket[bytes] | None = None
        try:
            self._pub.set_hwm(config.hwm)
            self._pub.setsockopt(zmq.LINGER, 0)
            if engine_binds(config.endpoint):
                self._pub.bind(config.endpoint)
            else:
                self._pub.connect(config.endpoint)
            if config.replay_endpoint is not None:
                self._replay = ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._replay.bind(config.replay_endpoint)
        except zmq.ZMQError:
            self._pub.close(linger=0)
            if self._replay is not None:
                self._replay.close(linger=0)
            raise
        self._thread = threading.Thread(target=self._run, name="kv-events-publisher", daemon=True)
        self._thread.start()

    def publish(self, events: Sequence[KvEvent]) -> None:
        """One engine step's events (never blocks the engine loop)."""
        try:
            self._queue.put_nowait((time.time(), events))
        except queue.Full:
            self.dropped += 1
            log.warning("KV events queue full: a step's events were dropped", extra={"dropped": self.dropped})

    def flush(self) -> None:
        """Block until every batch published so far is sent and kept for replay (tests)."""
        self._queue.join()

    def shutdown(self, timeout_s: float = 1.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        encoder = msgspec.msgpack.Encoder()
        seqs = count()
        try:
            while True:
                if self._replay is not None and self._replay.poll(0):
                    self._serve_replay()
                try:
                    item = self._queue.get(timeout=POLL_S)
                except queue.Empty:
                    continue
                if item is None:
                    self._queue.task_done()
                    return
                ts, events = item
                batch = EventBatch(ts=ts, events=wire_events(events, self.block_size), data_parallel_rank=0)
                seq, payload = next(seqs), encoder.encode(batch)
                self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
                self._buffer.append((seq, payload))
                self._queue.task_done()
        finally:
            self._pub.close(linger=0)
            if self._replay is not None:
                self._replay.close(linger=0)

    def _serve_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3:
            log.warning("KV events: invalid replay request", extra={"frames": len(frames)})
            return
        client_id, _, start = frames
        start_seq = int.from_bytes(start, "big")
        for seq, payload in self._buffer:
            if seq >= start_seq:
                self._replay.send_multipart((client_id, b"", self._topic, seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client_id, b"", b"", END_SEQ, b""))


class KvEventsError(ValueError):
    """The publisher's sockets cannot be set up (a bad or taken endpoint)."""


def make_publisher(config: KvEventsConfig, block_size: int) -> ZmqEventPublisher | None:
    """The publisher `config` asks for (None: events off, or vLLM's "null" publisher)."""
    if not config.publishes:
        return None
    try:
        return ZmqEventPublisher(config, block_size)
    except zmq.ZMQError as exc:
        raise KvEventsError(
            f"cannot publish KV events on {config.endpoint} (replay {config.replay_endpoint}): {exc}"
        ) from None
