"""The simulated vLLM V1 scheduler: continuous batching over a KV-block budget, in simulated time.

Pure and synchronous (no I/O, no wall clock): `step()` plans one engine step the way vLLM's
`Scheduler.schedule` does (`docs/vllm-facts.md` §7) and returns its
simulated duration and the tokens it produced. Time is the caller's: `now_s` is the scheduler's
simulated clock (the sum of step durations), and `advance_to(t)` moves it over idle time. The
enginesim loop (`apps/enginesim/engine.py`) sleeps each duration scaled by `--speed` and hands the
tokens to the HTTP streams; `llmfleet simulate` advances it from its event queue, taking many
identical decode steps at once (`fastforward.py`). Unit tests drive it directly to check
calibration in simulated time.

Rules followed:
- one token budget per step (`max_num_batched_tokens`) shared by decodes and prefill chunks
  (chunked prefill); running requests first, in order;
- KV blocks of `block_size` tokens are allocated for computed tokens as they grow; when none are
  free the LAST running request is preempted: its blocks are freed, its computed tokens reset to
  0 (recompute, no swap) and it goes back to the FRONT of the waiting queue;
- waiting requests are admitted only if nothing was preempted in this step, while fewer than
  `max_num_seqs` run and blocks for their first chunk are free;
- automatic prefix caching, as `prefix_cache.py` describes (requests with `block_hashes`): full
  blocks are cached as they are computed, prompt and generated tokens alike (`block_hashes` may
  cover the planned answer too: a block is cached only once its tokens are computed), and with
  `kv_events` the cache notes vLLM's KV cache events (`token_ids` gives their tokens);
- pause (vLLM's `pause_scheduler`): `paused_all` ("keep") schedules nothing, `paused_new`
  ("wait") only the running requests; `reset_prefix_cache(reset_running=True)` puts every running
  request back into the waiting queue (a preemption) and forgets the free cached blocks;
- `--scheduling-policy priority` (`policy="priority"`): the waiting queue is ordered by
  `(priority, arrival)` (lower first; a preempted request goes back in that order, not to the
  front), and the preemption victim is the running request with the highest `(priority, arrival)`
  instead of the last one — vLLM V1's priority policy (no preemption to admit a waiting request);
- a request yields one token in each step that completes its prompt (plus already generated
  tokens after a preemption) or decodes it; it finishes at its target length (`length` or
  `stop`) or at `max_model_len`.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from apps.core.batching.prefix_cache import BlocksStored, PrefixCache
from apps.core.batching.profile import EngineProfile


class SeqState(enum.Enum):
    WAITING = "waiting"  # queued, or preempted and waiting to recompute
    RUNNING = "running"
    FINISHED = "finished"  # left the scheduler (finished or aborted)


@dataclass(eq=False)  # identity: `in running` / `remove` must not compare every field
class Sequence:
    request_id: str
    prompt_tokens: int
    target_tokens: int  # completion tokens it will produce (after clamping to the context)
    finish_reason: str  # reported when target_tokens is reached: "length" or "stop"
    arrival_s: float
    state: SeqState = SeqState.WAITING
    computed: int = 0  # tokens whose KV is in the cache
    generated: int = 0
    blocks: int = 0
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    preemptions: int = 0
    priority: int = 0  # vLLM's per-request `priority` (lower first; used by the priority policy)
    block_hashes: tuple[int, ...] = ()  # chain hashes of the full blocks (prefix caching)
    token_ids: tuple[int, ...] = ()  # the tokens those blocks hold (KV cache events only)
    cache_salt: str | None = None  # part of the first block's hash (KV cache events report it)
    cached: list[int] = field(default_factory=list)  # the hashes of the cached blocks it holds
    num_cached_tokens: int | None = None  # prompt tokens found cached at its first scheduling

    @property
    def num_tokens(self) -> int:
        """Tokens the model has to have seen before producing the next one."""
        return self.prompt_tokens + self.generated


@dataclass(frozen=True)
class TokenOut:
    request_id: str
    index: int  # 0-based completion token index
    finish_reason: str | None  # set on the last token


@dataclass
class StepResult:
    duration_s: float
    tokens: list[TokenOut] = field(default_factory=list)
    prefill_tokens: int = 0
    scheduled_tokens: int = 0  # prefill chunks plus decodes: what vLLM's iteration_tokens observes
    batch: int = 0
    preempted: list[str] = field(default_factory=list)
    finished: list[Sequence] = field(default_factory=list)
    first_tokens: list[Sequence] = field(default_factory=list)


POLICIES = ("fcfs", "priority")


class Scheduler:
    def __init__(self, profile: EngineProfile, policy: str = "fcfs", kv_events: bool = False) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown scheduling policy {policy!r} (known: {', '.join(POLICIES)})")
        self.profile = profile
        self.by_priority = policy == "priority"
        self.free_blocks = profile.num_blocks - 1  # one null block, as vLLM
        self.running: list[Sequence] = []
        self.waiting: deque[Sequence] = deque()
        self.by_id: dict[str, Sequence] = {}
        self.num_preemptions = 0
        self.now_s = 0.0  # simulated time: the sum of step durations
        self.prefix = PrefixCache(events=kv_events)
        self.paused_all = False  # vLLM's PAUSED_ALL (pause mode "keep"): nothing is scheduled
        self.paused_new = False  # PAUSED_NEW ("wait", "abort"): running requests go on, none admitted

    # -- queue management -------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        if seq.request_id in self.by_id:
            raise ValueError(f"duplicate request id {seq.request_id}")
        self.by_id[seq.request_id] = seq
        if self.by_priority:
            self._wait_in_order(seq)
        else:
            self.waiting.append(seq)

    def _wait_in_order(self, seq: Sequence) -> None:
        """Insert by `(priority, arrival)`: after every waiting request that goes before it."""
        key = (seq.priority, seq.arrival_s)
        index = len(self.waiting)
        while index > 0 and (self.waiting[index - 1].priority, self.waiting[index - 1].arrival_s) > key:
            index -= 1
        self.waiting.insert(index, seq)

    def abort(self, request_id: str) -> Sequence | None:
        """Remove a request now and free its blocks (client disconnect)."""
        seq = self.by_id.pop(request_id, None)
        if seq is None:
            return None
        if seq.state is SeqState.RUNNING:
            self.running.remove(seq)
        elif seq.state is SeqState.WAITING:
            self.waiting.remove(seq)
        self._free(seq)
        seq.state = SeqState.FINISHED
        return seq

    def has_work(self) -> bool:
        if self.paused_all:
            return False
        if self.paused_new:
            return bool(self.running)
        return bool(self.running or self.waiting)

    def created_cache_tokens(self, seq: Sequence) -> int:
        """Prompt tokens `seq` computed into full cacheable blocks (vLLM's `created_cache_tokens`)."""
        bs = self.profile.block_size
        full = min(len(seq.block_hashes), seq.prompt_tokens // bs) * bs
        return max(0, full - (seq.num_cached_tokens or 0))

    def reset_prefix_cache(self, reset_running: bool) -> list[str]:
        """Forget the free cached blocks; with `reset_running`, first put every running request back
        into the waiting queue (preempted, newest first, so they queue in their old order). Returns
        the preempted request ids."""
        preempted = StepResult(duration_s=0.0)
        if reset_running:
            for seq in reversed(list(self.running)):
                self._preempt(seq, preempted)
        self.prefix.clear()
        return preempted.preempted

    @property
    def used_blocks(self) -> int:
        return self.profile.num_blocks - 1 - self.free_blocks

    @property
    def kv_cache_usage(self) -> float:
        return self.used_blocks / (self.profile.num_blocks - 1)

    # -- one step --------------------------------------------------------------------

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.profile.block_size)

    def _free(self, seq: Sequence) -> None:
        self.free_blocks += seq.blocks - len(seq.cached) + self.prefix.release(seq.cached)
        seq.cached = []
        seq.blocks = 0

    def _take_free(self, count: int) -> None:
        """Use `count` free blocks: empty ones first, then cached ones nobody holds, oldest first."""
        empty = self.free_blocks - len(self.prefix.evictable)
        if count > empty:
            self.prefix.evict(count - empty)
        self.free_blocks -= count

    def _allocate(self, seq: Sequence, new_tokens: int) -> bool:
        need = self._blocks_for(seq.computed + new_tokens) - seq.blocks
        if need > self.free_blocks:
            return False
        self._take_free(need)
        seq.blocks += need
        if seq.block_hashes:
            self._cache_full_blocks(seq, seq.computed + new_tokens)
        return True

    def _cache_full_blocks(self, seq: Sequence, tokens: int) -> None:
        """The blocks that `tokens` fill become cached, as vLLM caches them at allocation."""
        bs = self.profile.block_size
        full = min(min(tokens, seq.num_tokens) // bs, len(seq.block_hashes))
        first = len(seq.cached)
        for i in range(first, full):
            if not self.prefix.register(seq.block_hashes[i]):
                break  # that content is cached in another block: this copy stays the request's own
            seq.cached.append(seq.block_hashes[i])
        if self.prefix.events is not None and len(seq.cached) > first:
            last = len(seq.cached)
            self.prefix.note(
                BlocksStored(
                    block_hashes=seq.block_hashes[first:last],
                    parent_block_hash=seq.block_hashes[first - 1] if first else None,
                    token_ids=seq.token_ids[first * bs : last * bs],
                    first_block_salt=seq.cache_salt if first == 0 else None,
                )
            )

    def _hit(self, seq: Sequence, budget: int) -> int | None:
        """Admit `seq` onto its cached prefix if blocks for it and its first chunk are free: the
        tokens to compute in this step, or None (nothing changed)."""
        bs = self.profile.block_size
        hashes = seq.block_hashes[: self.prefix.match(seq.block_hashes, (seq.num_tokens - 1) // bs)]
        hit = len(hashes) * bs
        new = min(seq.num_tokens - hit, budget)
        need = self._blocks_for(hit + new) - len(hashes) + self.prefix.free_needed(hashes)
        if need > self.free_blocks:
            return None
        self.free_blocks -= self.prefix.take(hashes)
        seq.cached = list(hashes)
        seq.blocks = len(hashes)
        seq.computed = hit
        if seq.num_cached_tokens is None:
            seq.num_cached_tokens = hit
            if seq.block_hashes:
                self.prefix.record_lookup(seq.num_tokens, hit)
        return new

    def _preempt(self, seq: Sequence, result: StepResult) -> None:
        self.running.remove(seq)
        self._free(seq)
        seq.computed = 0
        seq.state = SeqState.WAITING
        seq.preemptions += 1
        self.num_preemptions += 1
        if self.by_priority:
            self._wait_in_order(seq)
        else:
            self.waiting.appendleft(seq)
        result.preempted.append(seq.request_id)

    def _victim(self) -> Sequence:
        if self.by_priority:
            return max(self.running, key=lambda s: (s.priority, s.arrival_s))
        return self.running[-1]

    def step(self) -> StepResult:
        result = StepResult(duration_s=0.0)
        if self.paused_all:
            return result
        scheduled: list[tuple[Sequence, int]] = []
        budget = self._schedule_running(self.profile.max_num_batched_tokens, scheduled, result)
        if not result.preempted and not self.paused_new:
            self._admit_waiting(budget, scheduled)
        self._advance(scheduled, result)
        return result

    def _schedule_running(
        self, budget: int, scheduled: list[tuple[Sequence, int]], result: StepResult
    ) -> int:
        """The running sequences' next tokens within `budget` (preempting for blocks); the budget left."""
        prof = self.profile
        bs = prof.block_size
        running_state = SeqState.RUNNING
        for seq in list(self.running):
            if budget <= 0:
                break
            if seq.state is not running_state:  # preempted earlier in this loop
                continue
            computed = seq.computed
            new = min(seq.prompt_tokens + seq.generated - computed, budget, prof.max_model_len - 1 - computed)
            new = max(new, 1)
            # Most steps need no new block (a decode fills its last block first): skip the allocator then.
            if -(-(computed + new) // bs) > seq.blocks:
                while not self._allocate(seq, new):
                    victim = self._victim()
                    self._preempt(victim, result)
                    if victim is seq:
                        break
                if seq.state is not running_state:
                    continue
            elif seq.block_hashes and (computed + new) // bs > len(seq.cached):
                self._cache_full_blocks(seq, computed + new)  # a decode filled its last block
            scheduled.append((seq, new))
            budget -= new
        return budget

    def _admit_waiting(self, budget: int, scheduled: list[tuple[Sequence, int]]) -> None:
        """Waiting sequences join, in order, while seats, budget and blocks last."""
        prof = self.profile
        while self.waiting and len(self.running) < prof.max_num_seqs and budget > 0:
            seq = self.waiting[0]
            new = self._hit(seq, budget)
            if new is None or not self._allocate(seq, new):
                break
            self.waiting.popleft()
            seq.state = SeqState.RUNNING
            self.running.append(seq)
            scheduled.append((seq, new))
            budget -= new

    def _advance(self, scheduled: list[tuple[Sequence, int]], result: StepResult) -> None:
        """Run the step: its duration from the batch's shape, then each sequence's computed tokens,
        its new token and whether it finished."""
        prof = self.profile
        # A decode is one new token on top of a complete context; anything else is prefill work.
        total = 0
        decodes = 0
        for s, n in scheduled:
            total += n
            if n == 1 and s.computed == s.prompt_tokens + s.generated - 1:
                decodes += 1
        prefill = total - decodes
        result.batch = len(scheduled)
        result.scheduled_tokens = total
        result.prefill_tokens = prefill
        result.duration_s = prof.step_s(result.batch, prefill) if scheduled else 0.0
        self.now_s += result.duration_s
        now = self.now_s

        for seq, new in scheduled:
            if seq.first_scheduled_s is None:
                seq.first_scheduled_s = now - result.duration_s
            seq.computed += new
            if seq.computed < seq.prompt_tokens + seq.generated:
                continue  # a prefill chunk that did not reach the end of the prompt
            index = seq.generated
            seq.generated += 1
            seq.last_token_s = now
            if seq.first_token_s is None:
                seq.first_token_s = now
                result.first_tokens.append(seq)
            reason: str | None = None
            if seq.generated >= seq.target_tokens:
                reason = seq.finish_reason
            elif seq.prompt_tokens + seq.generated >= prof.max_model_len:
                reason = "length"
            result.tokens.append(TokenOut(seq.request_id, index, reason))
            if reason is not None:
                self._finish(seq, result)

    def _finish(self, seq: Sequence, result: StepResult) -> None:
        self.running.remove(seq)
        self.by_id.pop(seq.request_id, None)
        self._free(seq)
        seq.state = SeqState.FINISHED
        result.finished.append(seq)

    # -- time and fast-forward (the simulator's use) ---------------------------------------

    def advance_to(self, t: float) -> None:
        """Idle time passes: the clock moves to `t` (never backwards)."""
        self.now_s = max(self.now_s, t)
