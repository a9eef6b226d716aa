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

Bounded whatever a node sends: an engine's index past `MAX_BLOCKS` (more than any engine holds) starts
again from nothing, and an engine keeps at most `MAX_ANNOUNCED` announcements (more are refused), so
neither this replica's memory nor the announcements in Redis grow with a broken or hostile node.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from apps.core.protocol.node import KvClearedOp, KvEvents, KvPrefix, KvRemovedOp, KvStoredOp
from apps.core.scheduling.prefix import ROOT, block_key

# Blocks indexed per engine and model: more than any engine holds (an 80 GB GPU holds about 40,000
# blocks of an 8B model's 16 tokens), and at most about 100 MB of this replica's memory.
MAX_BLOCKS = 1 << 19
MAX_ANNOUNCED = 1 << 16  # conversation prefixes announced per engine and model


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
    n_announced: int = 0

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
                        gone += self._unannounce(key)
            else:
                self.keys_of.clear()
                self.held.clear()
                self.depth.clear()
                gone += self.all_announced()
                self.announced.clear()
                self.n_announced = 0
        return gone

    def all_announced(self) -> list[str]:
        return [p for prefixes in self.announced.values() for p in prefixes]

    def _unannounce(self, key: bytes) -> set[str]:
        prefixes = self.announced.pop(key, set())
        self.n_announced -= len(prefixes)
        return prefixes

    def announce(self, prefix: str, block: bytes, blocks: int) -> bool:
        """Keep `prefix` while its last block is held; False (nothing kept) when this engine's events
        never stored that block, or not as the `blocks`-th of its chain."""
        if block not in self.held or self.depth.get(block) != blocks or self.n_announced >= MAX_ANNOUNCED:
            return False
        prefixes = self.announced.setdefault(block, set())
        self.n_announced += prefix not in prefixes
        prefixes.add(prefix)
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
        self.overflows = 0  # engine indexes started again past MAX_BLOCKS

    def apply(self, node_id: str, frame: KvEvents) -> list[str]:
        """One batch of the node's events; returns the prefixes to retract (their last block is gone)."""
        blocks = self._engines.setdefault((node_id, frame.model), EngineBlocks())
        if frame.seq <= blocks.last_seq:
            return []  # already applied (a replay overlapping what came live)
        blocks.last_seq = frame.seq
        gone = blocks.apply(frame.events)
        if len(blocks.keys_of) > MAX_BLOCKS:  # a broken or hostile node: its index starts again
            gone += blocks.all_announced()
            self._engines[(node_id, frame.model)] = EngineBlocks(last_seq=frame.seq)
            self.overflows += 1
        return gone

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
