"""The engine's KV cache events, forwarded to the orchestrator (protocol version 5; issue 29).

The engine publishes its events inside the pod or on the node itself: on `tcp://127.0.0.1:port`,
which vLLM connects to and this module binds (loopback only: nothing listens on the node's network;
the engine's replay socket is bound on loopback too), or on an `ipc://` path vLLM binds. This
module subscribes there and sends
each batch on the agent's existing WebSocket as `kv_events {model, seq, events}`, in the engine's
order (`apps/core/kvwire.py` has the wire format).

Sequence numbers run from 0 without gaps. A batch past the next expected one means some were lost
(PUB/SUB drops what a slow or late subscriber missed): the missing ones are asked for on the
engine's replay socket and sent first; if its buffer no longer holds them, the orchestrator is told
to forget this engine's index (`kv_reset gap`) and it is rebuilt from what follows. A sequence
number that goes back with another batch than the one sent under it means the engine restarted
(`kv_reset engine_restart`). An engine that stops answering (the agent sends no heartbeat) is
forgotten at once (`kv_reset engine_down`), and what follows it is taken from 0: a new engine's
batches, or the same engine's history replayed from its buffer if it was only slow. On every new
connection the orchestrator starts from nothing (`kv_reset connected`) and the engine's buffered
history is replayed from 0, so the index is whole again without waiting for new traffic.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import Literal

import msgspec
import zmq
import zmq.asyncio

from apps.agent.kvannounce import Announcer, Send
from apps.agent.settings import AgentSettings
from apps.core.kvwire import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    as_int,
    decode_batch,
    engine_binds,
    seq_of,
)
from apps.core.protocol import node as proto

log = logging.getLogger("llmfleet.agent")

REPLAY_TIMEOUT_S = 5.0  # the whole of one replay from the engine (loopback)
RETRY_S = 5.0  # after a KV events socket could not be set up


def loopback_only(endpoint: str) -> str:
    """A tcp endpoint the agent binds must be on loopback: anything that can reach it can feed the
    orchestrator's prefix index in this node's name."""
    host = endpoint.removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")
    if host not in ("127.0.0.1", "::1", "localhost"):
        raise zmq.ZMQError(msg=f"refusing to bind the KV events socket off loopback: {endpoint}")
    return endpoint


RECENT = 1024  # batches kept to tell a replay's overlap from an engine restart


def _first_tier(medium: str | None, group: int | None) -> bool:
    """An event of the GPU's first KV cache group: what a prefix hit reuses. Other media (a CPU
    offload tier) and other groups (a hybrid model's sliding-window layers) hold the same blocks
    again: merged in, a removal there would drop a block the GPU still holds."""
    return medium in (None, "GPU") and group in (None, 0)


def as_frame(model: str, seq: int, batch: KVEventBatch) -> proto.KvEvents:
    """One engine batch as the protocol's `kv_events` frame (the GPU's first KV cache group only)."""
    ops: list[proto.KvStoredOp | proto.KvRemovedOp | proto.KvClearedOp] = []
    for ev in batch.events:
        if isinstance(ev, BlockStored | BlockRemoved) and not _first_tier(ev.medium, ev.group_idx):
            continue
        if isinstance(ev, BlockStored):
            parent = ev.parent_block_hash
            extra = [list(k) if k is not None else None for k in ev.extra_keys] if ev.extra_keys else None
            ops.append(
                proto.KvStoredOp(
                    hashes=[as_int(h) for h in ev.block_hashes],
                    parent=None if parent is None else as_int(parent),
                    tokens=list(ev.token_ids),
                    block_size=ev.block_size,
                    extra=extra,
                )
            )
        elif isinstance(ev, BlockRemoved):
            ops.append(proto.KvRemovedOp(hashes=[as_int(h) for h in ev.block_hashes]))
        elif isinstance(ev, AllBlocksCleared):
            ops.append(proto.KvClearedOp())
    return proto.KvEvents(model=model, seq=seq, events=ops)


class KvForwarder:
    def __init__(self, model: str, endpoint: str, replay_endpoint: str | None) -> None:
        self.model = model
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.next_seq: int | None = None  # the next batch the orchestrator should get
        self.send: Send | None = None  # the current connection's (None: not connected)
        self.forwarded = 0
        self.resets = 0
        self.prefixes = Announcer(model, lambda: self.send)  # after each request (`kvannounce.py`)
        self._resets: set[asyncio.Future[None]] = set()  # `engine_down_soon`'s
        self._ctx = zmq.asyncio.Context.instance()
        self._order = asyncio.Lock()  # a connection's catch-up and the live batches, one at a time
        self._recent: OrderedDict[int, bytes] = OrderedDict()  # the last batches sent, by sequence

    @classmethod
    def for_settings(cls, settings: AgentSettings) -> KvForwarder | None:
        """The agent's forwarder (None: no KV events endpoint configured)."""
        if not settings.kv_events_endpoint:
            return None
        return cls(settings.model, settings.kv_events_endpoint, settings.kv_events_replay_endpoint)

    async def connected(self, send: Send) -> None:
        """A new connection (version 5): the orchestrator knows nothing of this engine yet."""
        async with self._order:
            self.send = send
            self.prefixes.moved()
            try:
                await self._reset("connected")
                self.next_seq = 0
                await self._catch_up(None)
            except Exception:  # never the agent's end: the live batches go on from here
                log.exception("kv_events_catch_up_failed", extra={"model": self.model})
                await self._reset("gap")

    def engine_down_soon(self) -> None:
        """`engine_down` in the background: the heartbeat that found the engine down never waits for
        a replay in progress."""
        task = asyncio.ensure_future(self.engine_down())
        self._resets.add(task)
        task.add_done_callback(self._resets.discard)

    async def engine_down(self) -> None:
        """The engine stopped answering: its cache is gone, or soon will be. The orchestrator forgets
        this engine's index now (once: not again until a batch was forwarded since), not when the next
        engine's first batch shows a restart."""
        async with self._order:
            if self.send is None or (self.next_seq == 0 and not self._recent):
                return  # not connected, or nothing forwarded since the last reset
            await self._reset("engine_down")
            self._recent.clear()
            self.next_seq = 0  # a new engine starts at 0; a slow one's history is replayed up to its next

    def disconnected(self, send: Send) -> None:
        """A connection ended: nothing more goes on it (a newer one, e.g. after a handover, goes on)."""
        if self.send == send:
            self.send = None

    async def run(self) -> None:
        """Subscribe and forward until cancelled. Nothing here ends the agent: this is an
        optimisation beside serving. A socket that cannot be set up is tried again after
        `RETRY_S`; a message that is not one of vLLM's resets the orchestrator's index."""
        while True:
            try:
                await self._subscribe()
            except zmq.ZMQError as exc:
                log.warning("kv_events_unavailable", extra={"model": self.model, "error": str(exc)})
            await asyncio.sleep(RETRY_S)  # a bounded retry cadence, not a wait for an event

    async def _subscribe(self) -> None:
        sub = self._ctx.socket(zmq.SUB)
        try:
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            if engine_binds(self.endpoint):
                sub.connect(self.endpoint)
            else:  # the engine connects its PUB to `tcp://127.0.0.1:port`: the subscriber binds it
                sub.bind(loopback_only(self.endpoint))
            while True:
                frames = await sub.recv_multipart()
                async with self._order:
                    try:
                        _topic, seq_frame, payload = frames
                        await self._live(seq_of(seq_frame), payload)
                    except Exception:  # a foreign or broken message: the index starts again
                        log.exception("kv_events_bad_message", extra={"model": self.model})
                        await self._reset("gap")
        finally:
            sub.close(linger=0)

    async def _live(self, seq: int, payload: bytes) -> None:
        if self.send is None:
            return  # no connection: `connected` replays the history
        if self.next_seq is not None and seq < self.next_seq:
            if self._recent.get(seq) == payload:
                return  # already sent: the replay of a catch-up overlapped what was queued live
            # The engine started again: its cache is empty and its numbering starts over (its
            # first batches may have been missed: the catch-up below asks its buffer for them).
            await self._reset("engine_restart")
            self._recent.clear()
            self.next_seq = 0
        if self.next_seq is not None and seq > self.next_seq:
            await self._catch_up(seq)
        await self._forward(seq, payload)

    async def _catch_up(self, before: int | None) -> None:
        """Send the batches from `next_seq` (up to `before`) from the engine's replay buffer; a
        hole it cannot fill resets the orchestrator's index."""
        assert self.next_seq is not None
        replayed = await self._replay_from(self.next_seq) if self.replay_endpoint is not None else []
        for seq, payload in replayed:
            if before is not None and seq >= before:
                break
            if seq > self.next_seq:  # the buffer starts later than what is missing
                await self._reset("gap")
            if seq >= self.next_seq:
                await self._forward(seq, payload)
        if before is not None and self.next_seq < before:
            await self._reset("gap")
            self.next_seq = before

    async def _replay_from(self, start: int) -> list[tuple[int, bytes]]:
        """The engine's buffered batches from `start`. The last batch sent before it is asked for too:
        if the engine's buffer holds another batch under that number, or none, the engine started
        again meanwhile (its first batches all missed, so no number went back): the index is reset
        and the new engine's batches are taken from 0."""
        anchor = start - 1
        if anchor not in self._recent:
            return await self._replay(start)
        replayed = await self._replay(anchor)
        if replayed[:1] == [(anchor, self._recent[anchor])]:
            return replayed[1:]
        await self._reset("engine_restart")
        self._recent.clear()
        self.next_seq = 0
        return await self._replay(0)

    async def _replay(self, start: int) -> list[tuple[int, bytes]]:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        assert self.replay_endpoint is not None
        sock.connect(self.replay_endpoint)
        out: list[tuple[int, bytes]] = []
        try:
            await sock.send_multipart((b"", start.to_bytes(8, "big")))
            async with asyncio.timeout(REPLAY_TIMEOUT_S):
                while True:
                    frames = await sock.recv_multipart()
                    if len(frames) != 4:
                        raise ValueError(f"a replay answer of {len(frames)} frames")
                    _empty, _topic, seq_frame, payload = frames
                    if seq_frame == END_SEQ:
                        return out
                    out.append((seq_of(seq_frame), payload))
        except TimeoutError:
            log.warning("kv_events_replay_timeout", extra={"model": self.model, "start": start})
            return out
        finally:
            sock.close(linger=0)

    async def _forward(self, seq: int, payload: bytes) -> None:
        try:
            batch = decode_batch(payload)
            frame = as_frame(self.model, seq, batch)
        except (msgspec.DecodeError, msgspec.ValidationError):
            log.warning("kv_events_undecodable", extra={"model": self.model, "seq": seq})
            await self._reset("gap")
        else:
            if self.send is not None and await self.send(frame):
                self.forwarded += 1
                self.prefixes.sent(frame)
        self._recent[seq] = payload
        while len(self._recent) > RECENT:
            self._recent.popitem(last=False)
        self.next_seq = seq + 1

    async def _reset(self, reason: Literal["connected", "engine_restart", "engine_down", "gap"]) -> None:
        self.resets += 1
        if self.send is not None:
            await self.send(proto.KvReset(model=self.model, reason=reason))
