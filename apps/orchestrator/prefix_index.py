"""What each node's engine holds in its prefix cache, per model, from the events the node forwards
(protocol version 5, `kv_events` / `kv_reset`; issue 29).

Blocks are keyed by this module's own chained hash of their tokens (`block_keys`), never by the
engine's hash: that one depends on the engine's `--prefix-caching-hash-algo` and on a seed taken
from `PYTHONHASHSEED` (random per process for the xxhash algorithms), so a router reproducing it
can silently match nothing. A `stored` event carries each block's tokens and its parent's engine
hash; the index maps every engine hash it has seen to its key, and a `removed` event is resolved
through that map. A block whose parent it never saw (its store came before the node's events
started reaching this replica) cannot be keyed and is left out: a missed hit, never a false one.

A node's index of a model is dropped when the node says so (`kv_reset`: a new connection, an
engine restart, a gap), when its socket here closes, and on `cleared`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from apps.core.protocol.node import KvClearedOp, KvEvents, KvPrefix, KvRemovedOp, KvStoredOp
from apps.core.scheduling.prefix import ROOT, block_key


@dataclass
class EngineBlocks:
    """One node's engine, one model: its cached blocks by key, and its hashes' keys."""

    keys_of: dict[int, bytes] = field(default_factory=dict)  # engine hash -> key
    held: set[bytes] = field(default_factory=set)
    last_seq: int = -1
    unkeyed: int = 0  # stored blocks left out: their parent was never seen
    # Conversation prefixes announced for this engine, by the key of their last block.
    announced: dict[bytes, set[str]] = field(default_factory=dict)
    depth: dict[bytes, int] = field(default_factory=dict)  # key -> its block's place in its chain (1..)

    def apply(self, ops: Iterable[KvStoredOp | KvRemovedOp | KvClearedOp]) -> list[str]:
        """Apply one batch; returns the announced prefixes whose last block is gone."""
        gone: list[str] = []
        for op in ops:
            if isinstance(op, KvStoredOp):
                self._stored(op)
            elif isinstance(op, KvRemovedOp):
                for engine_hash in op.hashes:
                    key = self.keys_of.pop(engine_hash, None)
                    if key is not None:
                        self.held.discard(key)
                        self.depth.pop(key, None)
                        gone += self.announced.pop(key, ())
            else:
                self.keys_of.clear()
                self.held.clear()
                self.depth.clear()
                gone += [p for prefixes in self.announced.values() for p in prefixes]
                self.announced.clear()
        return gone

    def announce(self, prefix: str, block: bytes, blocks: int) -> bool:
        """Keep `prefix` while its last block is held; False (nothing kept) when this engine's events
        never stored that block, or not as the `blocks`-th of its chain."""
        if block not in self.held or self.depth.get(block) != blocks:
            return False
        self.announced.setdefault(block, set()).add(prefix)
        return True

    def _stored(self, op: KvStoredOp) -> None:
        if op.parent is None:
            parent = ROOT
        elif op.parent in self.keys_of:
            parent = self.keys_of[op.parent]
        else:
            self.unkeyed += len(op.hashes)
            return
        size = op.block_size
        level = self.depth.get(parent, 0)
        for i, engine_hash in enumerate(op.hashes):
            extra = op.extra[i] if op.extra is not None and i < len(op.extra) else None
            parent = block_key(parent, op.tokens[i * size : (i + 1) * size], extra)
            level += 1
            self.keys_of[engine_hash] = parent
            self.held.add(parent)
            self.depth[parent] = level

    def matched(self, keys: Sequence[bytes]) -> int:
        """How many of `keys` (a prompt's blocks, in order) this engine holds from the first on."""
        n = 0
        for key in keys:
            if key not in self.held:
                break
            n += 1
        return n


class PrefixIndex:
    """Every node's `EngineBlocks` per model, on the replica that owns the node's socket."""

    def __init__(self) -> None:
        self._engines: dict[tuple[str, str], EngineBlocks] = {}

    def apply(self, node_id: str, frame: KvEvents) -> list[str]:
        """One batch of the node's events; returns the prefixes to retract (their last block is gone)."""
        blocks = self._engines.setdefault((node_id, frame.model), EngineBlocks())
        if frame.seq <= blocks.last_seq:
            return []  # already applied (a replay overlapping what came live)
        blocks.last_seq = frame.seq
        return blocks.apply(frame.events)

    def announce(self, node_id: str, frame: KvPrefix) -> bool:
        blocks = self._engines.get((node_id, frame.model))
        try:
            block = bytes.fromhex(frame.block)
        except ValueError:
            return False
        return blocks is not None and blocks.announce(frame.key, block, frame.blocks)

    def reset(self, node_id: str, model: str) -> None:
        self._engines.pop((node_id, model), None)

    def forget(self, node_id: str) -> None:
        """The node's socket here closed: nothing it said holds any more."""
        for key in [k for k in self._engines if k[0] == node_id]:
            del self._engines[key]

    def engine(self, node_id: str, model: str) -> EngineBlocks | None:
        return self._engines.get((node_id, model))

    def matched(self, node_id: str, model: str, keys: Sequence[bytes]) -> int:
        blocks = self._engines.get((node_id, model))
        return 0 if blocks is None else blocks.matched(keys)
