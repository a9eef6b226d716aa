"""The engine loop: runs the pure `Scheduler` against the wall clock and feeds the HTTP streams.

One task (started by the server inside its TaskGroup) repeats: plan a step, sleep until the step's
simulated end (scaled by `--speed`, on a deadline schedule so event-loop jitter does not
accumulate), then hand each produced token to its request's `OutputStream` and update the
metrics. Idle time passes in simulated time too, so latencies are measured from arrival.

Client disconnects call `abort()`, which removes the request from the scheduler and frees its KV
blocks at once.

Pause and resume follow vLLM's dev-mode `/pause` and `/resume` (`pause()`, `resume()`): "keep"
schedules nothing until resumed, "wait" lets the running requests finish but admits none (vLLM's
"abort" mode is not simulated). As in vLLM, the scheduler gauges are a snapshot of the last step, and a
paused engine takes no step, except the one an abort makes; so while paused, `/metrics` shows the
requests that arrived only after an abort. As in real vLLM, an aborted request is NOT counted in `request_success_total`
nor in the per-request histograms, but its tokens stay in `prompt_tokens_total` /
`generation_tokens_total`.

A pooling request (an embedding, `submit(..., pooling=True)`) is a sequence whose one output is the
end of its prefill: as vLLM counts pooling requests, its prompt tokens, TTFT and finish (`stop`) are
counted, and no generation token.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from collections.abc import Sequence as Seq
from typing import Protocol

from apps.core.batching.prefix_cache import KvEvent
from apps.core.batching.profile import EngineProfile
from apps.core.batching.scheduler import Scheduler, Sequence, StepResult, TokenOut
from apps.enginesim.metrics import EngineMetrics

CATCH_UP_WALL_S = 0.05
PAUSE_MODES = ("keep", "wait")


class KvEventSink(Protocol):
    """Where each step's KV cache events go (`kvevents.ZmqEventPublisher`); must not block."""

    def publish(self, events: Seq[KvEvent]) -> None: ...


class OutputStream:
    """Tokens of one HTTP request (all its choices) on their way from the engine loop to the handler.

    Holds at most the request's own completion tokens (bounded by `n x max_model_len`).
    """

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self._pending: deque[TokenOut] = deque()
        self._ready = asyncio.Event()
        # Prefix caching, from the request's first scheduling (the first of its choices to get there).
        self.cached_tokens: int | None = None
        self.created_cache_tokens: int | None = None

    def push(self, token: TokenOut) -> None:
        self._pending.append(token)
        self._ready.set()

    async def next_tokens(self) -> list[TokenOut]:
        """Wait for at least one token; returns every token produced since the last call."""
        while not self._pending:
            self._ready.clear()
            await self._ready.wait()
        out = list(self._pending)
        self._pending.clear()
        return out


class Engine:
    def __init__(
        self,
        profile: EngineProfile,
        metrics: EngineMetrics,
        speed: float = 1.0,
        clock: Callable[[], float] | None = None,
        scheduling_policy: str = "fcfs",
        kv_events: KvEventSink | None = None,
    ) -> None:
        if speed <= 0:
            raise ValueError(f"speed must be greater than 0, got {speed}")
        self.profile = profile
        self.metrics = metrics
        self.speed = speed
        self._clock = clock or (lambda: asyncio.get_running_loop().time())
        self._t0: float | None = None
        self.scheduler = Scheduler(profile, scheduling_policy, kv_events=kv_events is not None)
        self._kv_events = kv_events
        self._streams: dict[str, OutputStream] = {}
        self._wake = asyncio.Event()
        # Preempted requests not yet scheduled again: vLLM counts a preemption in
        # `num_preemptions_total` only then (the event rides on the request's next output).
        self._preempted: dict[str, int] = {}
        self.dead = False  # the loop crashed: /health answers 503, as vLLM with a dead engine
        self._drained = asyncio.Event()  # a "wait" pause: set once nothing runs
        self._prefix_counted = (0, 0)  # the scheduler's prefix-cache (queries, hits) already in metrics
        self._pooling: set[str] = set()  # pooling requests in the engine (no generation tokens)

    def sim_now(self) -> float:
        if self._t0 is None:
            self._t0 = self._clock()
        return (self._clock() - self._t0) * self.speed

    @property
    def in_flight(self) -> int:
        return len(self._streams)

    def submit(
        self,
        request_id: str,
        prompt_tokens: int,
        target_tokens: int,
        finish_reason: str,
        sink: OutputStream | None = None,
        priority: int = 0,
        block_hashes: tuple[int, ...] = (),
        token_ids: tuple[int, ...] = (),
        cache_salt: str | None = None,
        pooling: bool = False,
    ) -> OutputStream:
        """Queue one sequence. `pooling`: a pooling request (an embedding), whose one "token" is
        the end of its prefill: counted as vLLM counts pooling requests (prompt tokens, TTFT, a
        finished request; no generation token)."""
        if pooling:
            self._pooling.add(request_id)
        seq = Sequence(
            request_id=request_id,
            prompt_tokens=prompt_tokens,
            target_tokens=target_tokens,
            finish_reason=finish_reason,
            arrival_s=self.sim_now(),
            priority=priority,
            block_hashes=block_hashes,
            token_ids=token_ids,
            cache_salt=cache_salt,
        )
        self.scheduler.add(seq)
        stream = sink or OutputStream(request_id)
        self._streams[request_id] = stream
        if not self.paused:  # a paused engine takes no step: its gauges stay as they were
            self._update_gauges()
        self._wake.set()
        return stream

    @property
    def paused(self) -> bool:
        return self.scheduler.paused_all or self.scheduler.paused_new

    async def pause(self, mode: str, clear_cache: bool) -> None:
        """vLLM's `pause_generation` in mode "keep" or "wait" ("wait" returns once nothing runs);
        `clear_cache` puts the running requests back into the waiting queue and forgets the prefix
        cache, as vLLM's does."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode {mode!r} is not simulated (known: {', '.join(PAUSE_MODES)})")
        sched = self.scheduler
        sched.paused_all = mode == "keep"
        sched.paused_new = mode != "keep"
        if mode == "wait" and sched.running:
            self._drained.clear()
            await self._drained.wait()
        if clear_cache:
            for request_id in sched.reset_prefix_cache(reset_running=True):
                self._preempted[request_id] = self._preempted.get(request_id, 0) + 1
            self._publish_kv_events()
        self._update_gauges()

    def resume(self) -> None:
        self.scheduler.paused_all = self.scheduler.paused_new = False
        self._wake.set()

    def abort(self, request_id: str) -> None:
        """Client went away: drop the request and free its blocks now (idempotent)."""
        self._streams.pop(request_id, None)
        self._pooling.discard(request_id)
        self._preempted.pop(request_id, None)  # never output again: never counted, as in vLLM
        if self.scheduler.abort(request_id) is not None:
            self._update_gauges()

    def _update_gauges(self) -> None:
        m = self.metrics
        sched = self.scheduler
        m.running.set(len(sched.running))
        m.waiting.set(len(sched.waiting))
        m.kv_usage.set(sched.kv_cache_usage)
        queries, hits = self._prefix_counted
        m.prefix_cache_queries.inc(sched.prefix.queries - queries)
        m.prefix_cache_hits.inc(sched.prefix.hits - hits)
        self._prefix_counted = (sched.prefix.queries, sched.prefix.hits)

    async def run(self) -> None:
        try:
            await self._loop()
        except asyncio.CancelledError:
            raise
        except Exception:
            self.dead = True
            raise

    async def _loop(self) -> None:
        sched = self.scheduler
        self.sim_now()  # start the clock
        assert self._t0 is not None
        while True:
            if not sched.has_work():
                if not sched.running:
                    self._drained.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            # Time that passed while idle, or while the loop fell far behind, is simulated time too;
            # small lateness (timer jitter) is caught up by the following steps' shorter sleeps.
            behind = self.sim_now() - sched.now_s
            if behind > CATCH_UP_WALL_S * self.speed:
                sched.now_s += behind
            result = sched.step()
            self._update_gauges()
            delay = self._t0 + sched.now_s / self.speed - self._clock()
            if delay > 0:
                await asyncio.sleep(delay)
            self._deliver(result)
            self._update_gauges()

    def _publish_kv_events(self) -> None:
        if self._kv_events is not None:
            events = self.scheduler.prefix.take_events()
            if events:
                self._kv_events.publish(events)

    def _deliver(self, result: StepResult) -> None:
        self._publish_kv_events()  # one batch per step, as vLLM's scheduler publishes
        m = self.metrics
        if result.batch:
            m.iteration_tokens.observe(result.scheduled_tokens)
        for request_id in result.preempted:
            self._preempted[request_id] = self._preempted.get(request_id, 0) + 1
        for seq in result.first_tokens:
            # vLLM counts the whole prompt when the first token comes out.
            m.prompt_tokens.inc(seq.prompt_tokens)
            out = self._streams.get(seq.request_id)
            if out is not None and out.cached_tokens is None:
                out.cached_tokens = seq.num_cached_tokens or 0
                out.created_cache_tokens = self.scheduler.created_cache_tokens(seq)
            if seq.first_token_s is not None:
                m.ttft.observe(seq.first_token_s - seq.arrival_s)
        now = self.scheduler.now_s
        live_tokens = 0
        for token in result.tokens:
            if self._preempted and token.request_id in self._preempted:
                m.preemptions.inc(self._preempted.pop(token.request_id))
            stream = self._streams.get(token.request_id)
            if stream is None:
                continue
            if token.request_id not in self._pooling:
                live_tokens += 1
            if token.index > 0:
                m.itl.observe(result.duration_s)
            stream.push(token)
            if token.finish_reason is not None:
                self._streams.pop(token.request_id, None)
        m.generation_tokens.inc(live_tokens)
        for seq in result.finished:
            pooled = seq.request_id in self._pooling
            self._pooling.discard(seq.request_id)
            m.success[seq.finish_reason if seq.generated >= seq.target_tokens else "length"].inc()
            m.e2e.observe(now - seq.arrival_s)
            m.request_prompt_tokens.observe(seq.prompt_tokens)
            m.request_generation_tokens.observe(0 if pooled else seq.generated)
            if seq.first_scheduled_s is not None:
                m.queue_time.observe(max(0.0, seq.first_scheduled_s - seq.arrival_s))
