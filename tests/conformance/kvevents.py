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
everything it wants to read (`stored_after`): the publisher keeps its order, so everything before
has arrived. `replay` asks the publisher's ROUTER socket (`replay_endpoint`) for its buffered
batches, the way vLLM answers it.

The log keeps the wire shape too (`shapes`: the keys of each event type; `batch_shapes`: each
batch's length and data-parallel rank), so a check can hold both engines to the same format.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec
import zmq

from tests.conformance.conftest import EngineUnderTest
from tests.conformance.slots import words

POLL_MS = 100  # how often the reader thread checks whether it should stop
PREFIX = 16  # prompt tokens that tell requests' first blocks apart
EVENTS_DEADLINE_S = 120.0  # bounds a broken engine only: each wait ends on an event
LIVE_WAIT_S = 2.0  # one marker's wait while the subscription may not be live yet
END_SEQ = (-1).to_bytes(8, "big", signed=True)  # vLLM's end of a replay


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
    first_seq: int = -1  # the first sequence number this subscriber received
    block_size: int = 0  # tokens per block, as the events say
    gaps: int = 0  # sequence numbers skipped (a lost message would make a verdict wrong)
    cleared: int = 0  # AllBlocksCleared events
    topics: set[bytes] = field(default_factory=set)
    shapes: dict[str, set[frozenset[str]]] = field(default_factory=dict)  # event type -> key sets
    batch_shapes: set[tuple[int, Any]] = field(default_factory=set)  # (array length, dp rank)
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
                topic, seq_bytes, payload = sock.recv_multipart()
                self._take(topic, int.from_bytes(seq_bytes, "big"), decoder.decode(payload))
        finally:
            sock.close(linger=0)

    def _take(self, topic: bytes, seq: int, batch: list[Any]) -> None:
        with self._cond:
            if self.last_seq >= 0 and seq != self.last_seq + 1:
                self.gaps += seq - self.last_seq - 1
            if self.first_seq < 0:
                self.first_seq = seq
            self.last_seq = seq
            self.topics.add(topic)
            self.batch_shapes.add((len(batch), batch[2] if len(batch) > 2 else None))
            for event in batch[1]:
                kind = event.get("type")
                self.shapes.setdefault(str(kind), set()).add(frozenset(event))
                if kind == "BlockStored":
                    self._stored(event)
                elif kind == "BlockRemoved":
                    self.removed.extend(_hashable(h) for h in event["block_hashes"])
                elif kind == "AllBlocksCleared":
                    self.cleared += 1
            self._cond.notify_all()

    def _stored(self, event: dict[str, Any]) -> None:
        size, tokens = int(event["block_size"]), list(event["token_ids"])
        self.block_size = size
        parent = _hashable(event.get("parent_block_hash"))
        for i, block_hash in enumerate(event["block_hashes"]):
            h = _hashable(block_hash)
            self.stored.append(StoredBlock(h, parent, tuple(tokens[i * size : (i + 1) * size])))
            parent = h

    def backfill(self, replay_endpoint: str, timeout_s: float) -> None:
        """Put the batches sent before this subscriber's first one (lost to the slow joiner) at the
        front of the log, from the publisher's replay socket."""
        early = KvEventLog(self.endpoint)
        for topic, seq, batch in replay(replay_endpoint, 0, timeout_s):
            if seq < self.first_seq:
                early._take(topic, seq, batch)
        with self._cond:
            if (
                early.gaps
                or early.first_seq != min(0, self.first_seq - 1)
                or early.last_seq != self.first_seq - 1
            ):
                raise AssertionError(
                    f"replay did not give batches 0..{self.first_seq - 1}: {early.summary()}"
                )
            self.stored[:0] = early.stored
            self.removed[:0] = early.removed
            self.cleared += early.cleared
            self.topics |= early.topics
            self.batch_shapes |= early.batch_shapes
            for kind, shapes in early.shapes.items():
                self.shapes.setdefault(kind, set()).update(shapes)
            self.first_seq = 0

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


def chain_in(blocks: list[StoredBlock], prefix: tuple[int, ...]) -> list[StoredBlock]:
    """The blocks of one request among `blocks` (in event order): the first block whose tokens start
    with `prefix` and has no parent, then each block whose parent is the last one taken."""
    chain: list[StoredBlock] = []
    for b in blocks:
        if (chain and b.parent == chain[-1].block_hash) or (
            not chain and b.parent is None and b.tokens[: len(prefix)] == prefix
        ):
            chain.append(b)
    return chain


def replay(endpoint: str, start_seq: int, timeout_s: float) -> list[tuple[bytes, int, list[Any]]]:
    """Every batch the publisher still buffers from `start_seq`, as (topic, seq, decoded payload),
    asked on its ROUTER socket as vLLM's protocol has it: `[b"", start_seq]` from a DEALER, answered
    by `[b"", topic, seq, payload]` frames and then `[b"", b"", END_SEQ, b""]`."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    out: list[tuple[bytes, int, list[Any]]] = []
    end = time.monotonic() + timeout_s
    try:
        sock.send_multipart([b"", start_seq.to_bytes(8, "big")])
        while True:
            left_ms = int((end - time.monotonic()) * 1000)
            if left_ms <= 0 or not sock.poll(left_ms):
                raise AssertionError(
                    f"replay from {start_seq}: no END_SEQ within {timeout_s} s ({len(out)} batches)"
                )
            _empty, topic, seq, payload = sock.recv_multipart()
            if seq == END_SEQ:
                assert (topic, payload) == (b"", b""), (topic, payload)
                return out
            out.append((topic, int.from_bytes(seq, "big"), msgspec.msgpack.decode(payload)))
    finally:
        sock.close(linger=0)


async def prompt_ids(engine: EngineUnderTest, conversation: str | list[dict[str, str]]) -> list[int]:
    """The token ids the engine computes for a chat request (a user message's text, or the messages;
    its template and generation prompt included)."""
    messages = [{"role": "user", "content": conversation}] if isinstance(conversation, str) else conversation
    async with httpx.AsyncClient(timeout=60.0) as client:
        resp = await client.post(f"{engine.url}/tokenize", json={"model": engine.model, "messages": messages})
        assert resp.status_code == 200, resp.text
        return [int(t) for t in resp.json()["tokens"]]


def wait_live(
    engine: EngineUnderTest, log: KvEventLog, tag: str, replay_endpoint: str | None = None, attempts: int = 30
) -> None:
    """Until the subscription is live: PUB drops what it sends before the subscriber's subscription
    reached it (ZMQ's slow joiner), so a marker request whose event does not come is sent again;
    with a `replay_endpoint`, what was lost is then fetched from it (`backfill`)."""
    with httpx.Client(timeout=60.0) as client:
        for i in range(attempts):
            text = words(f"{tag}{i}x", 40)
            body = {"model": engine.model, "messages": [{"role": "user", "content": text}], "max_tokens": 1}
            tokens = client.post(
                f"{engine.url}/tokenize", json={"model": engine.model, "messages": body["messages"]}
            )
            assert tokens.status_code == 200, tokens.text
            first = tuple(int(t) for t in tokens.json()["tokens"][:PREFIX])
            sent = client.post(f"{engine.url}/v1/chat/completions", json=body)
            assert sent.status_code == 200, sent.text
            try:
                log.wait_for(lambda lg, f=first: lg.has_block_starting(f), "a marker", LIVE_WAIT_S)
            except AssertionError:
                continue
            if replay_endpoint is not None:
                log.backfill(replay_endpoint, EVENTS_DEADLINE_S)
            return
    raise AssertionError(f"KV events: no marker's event came in {attempts} attempts ({log.summary()})")


async def stored_after(engine: EngineUnderTest, log: KvEventLog, tag: str) -> None:
    """Send one more request and wait for its first block's event: the publisher keeps its order, so
    every event of what ran before has arrived too."""
    text = words(tag, 40)
    first = tuple((await prompt_ids(engine, text))[:PREFIX])
    async with httpx.AsyncClient(timeout=60.0) as client:
        body = {"model": engine.model, "messages": [{"role": "user", "content": text}], "max_tokens": 1}
        resp = await client.post(f"{engine.url}/v1/chat/completions", json=body)
        assert resp.status_code == 200, resp.text
    await asyncio.to_thread(
        log.wait_for, lambda lg: lg.has_block_starting(first), f"the block of {tag!r}", EVENTS_DEADLINE_S
    )


async def prompt_of(engine: EngineUnderTest, tag: str, tokens: int) -> str:
    """Words unique to this run, as many as make about `tokens` prompt tokens on this engine."""
    async with httpx.AsyncClient(timeout=60.0) as client:

        async def count(text: str) -> int:
            body = {"model": engine.model, "messages": [{"role": "user", "content": text}]}
            resp = await client.post(f"{engine.url}/tokenize", json=body)
            assert resp.status_code == 200, resp.text
            return int(resp.json()["count"])

        base = await count("")
        per_word = (await count(words(tag, 50)) - base) / 50
        n = max(1, round((tokens - base) / per_word))
        for _ in range(6):  # a bounded refinement: each word is a few BPE tokens
            got = await count(words(tag, n))
            if abs(got - tokens) <= tokens // 50 + 4:
                return words(tag, n)
            n = max(1, n + round((tokens - got) / per_word))
        raise AssertionError(f"no prompt of about {tokens} tokens: {n} words make {got}")


def _hashable(value: Any) -> Any:
    """Block hashes arrive as ints or bytes (or lists, for a multi-part hash)."""
    return tuple(value) if isinstance(value, list) else value
