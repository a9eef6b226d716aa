"""An engine's KV cache events, as vLLM 0.32 publishes them with `--kv-events-config`.

vLLM's publisher (`vllm/distributed/kv_events.py`) sends each engine step's events as one ZMQ
PUB message of three frames: the topic, an 8-byte big-endian sequence number, and a msgpack
payload (`EventBatch`, encoded as an array `[ts, events, data_parallel_rank]`; each event a tagged
map: `{"type": "BlockStored", "block_hashes": [...], "parent_block_hash": ..., "token_ids": [...],
"block_size": 16, ...}`, `{"type": "BlockRemoved", "block_hashes": [...]}`, `{"type":
"AllBlocksCleared"}`). A `BlockStored` is sent when a full block of a request's tokens has been
computed and entered the prefix cache; a `BlockRemoved` when a cached block is evicted to be reused.

So a block whose hash is stored twice was computed twice: it was evicted, then its request needed
it again (a preempted request computed again from its first token). That is what the KV-pressure
check reads, after the fact, from the log this module keeps.

PUB/SUB drops messages sent before the subscription is live, so a check first waits for an event
of its own (`wait_for`), and, before reading the log, for the event of a last request sent after
everything it wants to read: the publisher keeps its order, so everything before has arrived.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq

POLL_MS = 100  # how often the reader thread checks whether it should stop


@dataclass(frozen=True)
class StoredBlock:
    block_hash: Any
    parent: Any
    tokens: tuple[int, ...]


@dataclass
class KvEventLog:
    """Every KV event one engine published since `start()`, read by a thread on a SUB socket."""

    endpoint: str
    stored: list[StoredBlock] = field(default_factory=list)
    removed: list[Any] = field(default_factory=list)
    last_seq: int = -1
    block_size: int = 0  # tokens per block, as the events say
    gaps: int = 0  # sequence numbers skipped (a lost message would make a verdict wrong)
    _cond: threading.Condition = field(default_factory=threading.Condition, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def start(self) -> None:
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.endpoint)
        self._thread = threading.Thread(target=self._run, args=(sock,), name="kv-events", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self, sock: zmq.Socket[bytes]) -> None:
        decoder = msgspec.msgpack.Decoder()
        try:
            while not self._stop.is_set():
                if not sock.poll(POLL_MS):
                    continue
                _topic, seq_bytes, payload = sock.recv_multipart()
                self._take(int.from_bytes(seq_bytes, "big"), decoder.decode(payload))
        finally:
            sock.close(linger=0)

    def _take(self, seq: int, batch: list[Any]) -> None:
        with self._cond:
            if self.last_seq >= 0 and seq != self.last_seq + 1:
                self.gaps += seq - self.last_seq - 1
            self.last_seq = seq
            for event in batch[1]:
                kind = event.get("type")
                if kind == "BlockStored":
                    self._stored(event)
                elif kind == "BlockRemoved":
                    self.removed.extend(_hashable(h) for h in event["block_hashes"])
            self._cond.notify_all()

    def _stored(self, event: dict[str, Any]) -> None:
        size, tokens = int(event["block_size"]), list(event["token_ids"])
        self.block_size = size
        parent = _hashable(event.get("parent_block_hash"))
        for i, block_hash in enumerate(event["block_hashes"]):
            h = _hashable(block_hash)
            self.stored.append(StoredBlock(h, parent, tuple(tokens[i * size : (i + 1) * size])))
            parent = h

    def wait_for(self, predicate: Callable[[KvEventLog], bool], what: str, timeout_s: float) -> None:
        """Block until `predicate(self)` holds (AssertionError after `timeout_s`)."""
        end = time.monotonic() + timeout_s
        with self._cond:
            while not predicate(self):
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"KV events: {what}: not within {timeout_s} s ({self.summary()})")
                self._cond.wait(left)

    def has_block_starting(self, prefix: tuple[int, ...]) -> bool:
        with self._cond:
            return any(b.tokens[: len(prefix)] == prefix for b in self.stored)

    def summary(self) -> str:
        return f"{len(self.stored)} stored, {len(self.removed)} removed, last seq {self.last_seq}, gaps {self.gaps}"

    def chain_from(self, prefix: tuple[int, ...]) -> set[Any]:
        """The hashes of every block stored in the chain whose first block starts with `prefix` (a
        request's first prompt tokens): that request's blocks, prompt and answer, found by following
        parent hashes."""
        with self._cond:
            roots = {
                b.block_hash for b in self.stored if b.parent is None and b.tokens[: len(prefix)] == prefix
            }
            chain, grew = set(roots), True
            while grew:
                grew = False
                for b in self.stored:
                    if b.parent in chain and b.block_hash not in chain:
                        chain.add(b.block_hash)
                        grew = True
            return chain

    def stored_twice(self, hashes: Iterable[Any]) -> int:
        """How many of `hashes` were stored more than once (computed, evicted, computed again)."""
        wanted = set(hashes)
        with self._cond:
            counts: dict[Any, int] = {}
            for b in self.stored:
                if b.block_hash in wanted:
                    counts[b.block_hash] = counts.get(b.block_hash, 0) + 1
        return sum(1 for n in counts.values() if n > 1)


def _hashable(value: Any) -> Any:
    """Block hashes arrive as ints or bytes (or lists, for a multi-part hash)."""
    return tuple(value) if isinstance(value, list) else value
