"""vLLM V1's automatic prefix caching, as the simulated scheduler needs it: full KV blocks of a
prompt, named by a chain hash, shared between requests and kept after their requests end until
their blocks are needed again.

The rules followed (vLLM 0.32, `vllm/v1/core/kv_cache_manager.py` and `block_pool.py`):
- a block's hash chains its parent's hash with the block's token ids (the first block also with
  the request's `cache_salt`), so two prompts share cached blocks exactly as far as their tokens
  agree, block by block; only full blocks are cached;
- a new request looks up the longest run of its leading block hashes that are cached, at most
  `num_tokens - 1` tokens (the last token is always computed, for its logits); those tokens are
  computed already (`cached_tokens` in usage is that number at the request's first scheduling);
- a block is cached when it is allocated for tokens that fill it, so a request admitted later in
  the same step already hits the blocks of one admitted before it;
- a block whose last user ended stays cached but counts as free; free blocks are reused oldest
  first, and a request's blocks are freed tail first, so its last blocks are evicted first;
- `vllm:prefix_cache_queries` / `vllm:prefix_cache_hits` count the tokens looked up and found, for
  a request's first lookup only (a preempted request's lookup again is not counted);
- with KV cache events on (`PrefixCache(events=True)`), the cache notes what vLLM's `BlockPool`
  queues for its publisher: a `BlockStored` per run of blocks one request caches at one allocation
  (parent: the request's block before the run, None for its first block), a `BlockRemoved` per
  evicted block, `AllBlocksCleared` on a reset; the engine takes them after each step
  (`take_events`), one batch a step.

Pure bookkeeping: it never counts physical blocks itself; the scheduler asks it which hashes it
holds and how many free blocks are only cached (`evictable`).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class BlocksStored:
    """Full blocks of one request that entered the cache (vLLM's `BlockStored`)."""

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None  # the request's block before these; None from its first block
    token_ids: tuple[int, ...]  # every token of these blocks, in order
    first_block_salt: str | None = None  # the request's cache_salt when the first block is block 0


@dataclass(frozen=True)
class BlockRemoved:
    block_hash: int


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


KvEvent = BlocksStored | BlockRemoved | AllBlocksCleared


def block_hashes(token_ids: Sequence[int], block_size: int, salt: str | None = None) -> tuple[int, ...]:
    """The chain hash of each full block of `token_ids` (a partial last block has none)."""
    out: list[int] = []
    parent = b"salt:" + salt.encode() if salt else b""
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        h = hashlib.blake2b(parent, digest_size=8)
        h.update(b",".join(str(t).encode() for t in token_ids[start : start + block_size]))
        digest = h.digest()
        out.append(int.from_bytes(digest, "big"))
        parent = digest
    return tuple(out)


class PrefixCache:
    def __init__(self, events: bool = False) -> None:
        self.in_use: dict[int, int] = {}  # hash -> requests holding that block
        self.evictable: OrderedDict[int, None] = OrderedDict()  # free but still cached, oldest first
        self.queries = 0  # tokens looked up (first lookups only)
        self.hits = 0  # tokens found
        self.events: list[KvEvent] | None = [] if events else None  # since the last `take_events`

    def note(self, event: KvEvent) -> None:
        if self.events is not None:
            self.events.append(event)

    def take_events(self) -> list[KvEvent]:
        """The events since the last call (none when events are off)."""
        if not self.events:
            return []
        out, self.events = self.events, []
        return out

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self.in_use or block_hash in self.evictable

    def match(self, hashes: Sequence[int], max_blocks: int) -> int:
        """How many of the leading `hashes` are cached (at most `max_blocks`)."""
        n = 0
        for h in hashes[: max(0, max_blocks)]:
            if h not in self:
                break
            n += 1
        return n

    def free_needed(self, hashes: Sequence[int]) -> int:
        """How many free blocks taking `hashes` (all cached) uses: those nobody holds now."""
        return sum(1 for h in hashes if h not in self.in_use)

    def record_lookup(self, num_tokens: int, hit_tokens: int) -> None:
        self.queries += num_tokens
        self.hits += hit_tokens

    def take(self, hashes: Sequence[int]) -> int:
        """A request starts holding these cached blocks; returns how many left the free pool."""
        from_free = 0
        for h in hashes:
            if h in self.in_use:
                self.in_use[h] += 1
            else:
                del self.evictable[h]
                self.in_use[h] = 1
                from_free += 1
        return from_free

    def register(self, block_hash: int) -> bool:
        """A block a request just filled becomes cached (held by that request). False when that
        content is cached already in another block (the request keeps its own copy uncached)."""
        if block_hash in self:
            return False
        self.in_use[block_hash] = 1
        return True

    def release(self, hashes: Sequence[int]) -> int:
        """A request stops holding these blocks (tail first); returns how many became free."""
        freed = 0
        for h in reversed(hashes):
            left = self.in_use[h] - 1
            if left:
                self.in_use[h] = left
            else:
                del self.in_use[h]
                self.evictable[h] = None
                freed += 1
        return freed

    def evict(self, count: int) -> None:
        """Reuse `count` free blocks that still hold cached content, oldest first."""
        for _ in range(count):
            block_hash, _ = self.evictable.popitem(last=False)
            self.note(BlockRemoved(block_hash))

    def clear(self) -> None:
        """Forget every free cached block (vLLM's `reset_prefix_cache`; held ones stay). vLLM resets
        only when no block is held, and only then says `AllBlocksCleared`."""
        self.evictable.clear()
        if not self.in_use:
            self.note(AllBlocksCleared())
