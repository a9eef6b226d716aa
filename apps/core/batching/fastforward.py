"""Many identical decode steps at once, for `llmfleet simulate`: `FastScheduler.fast_forward(k)` is
exactly `k` calls of `step()` whenever `decode_run()` allows `k` (checked by a unit test), so a
simulated pod wakes once per segment instead of once per token."""

from __future__ import annotations

from apps.core.batching.scheduler import Scheduler, StepResult


class FastScheduler(Scheduler):
    def decode_run(self) -> int:
        """How many of the next steps are identical pure-decode steps (0 or 1: just call `step()`).

        True while every running request is decoding, nothing waiting could be admitted, the
        batch fits the token budget, no request reaches its end before the last of those steps
        and the KV blocks for all of them are free.
        """
        prof = self.profile
        running = self.running
        if not running or len(running) > prof.max_num_batched_tokens:
            return 0
        if self.waiting and len(running) < prof.max_num_seqs:
            return 0
        last = running[-1]  # the newest request is the one most likely still in prefill
        if last.computed != last.prompt_tokens + last.generated - 1 or last.generated == 0:
            return 0
        steps = 1 << 30
        max_len = prof.max_model_len
        for seq in running:
            generated = seq.generated
            tokens = seq.prompt_tokens + generated
            if seq.computed != tokens - 1 or generated == 0:
                return 0  # a prefill chunk, or the first token (its time is recorded by step())
            left = seq.target_tokens - generated
            if max_len - tokens < left:
                left = max_len - tokens
            if left < steps:
                steps = left
        while steps > 1 and self._blocks_needed(steps) > self.free_blocks:
            steps //= 2
        return steps if steps > 1 and self._blocks_needed(steps) <= self.free_blocks else 0

    def _blocks_needed(self, steps: int) -> int:
        return sum(self._blocks_for(s.computed + steps) - s.blocks for s in self.running)

    def fast_forward(self, steps: int) -> StepResult:
        """`steps` decode steps at once (only after `decode_run()` allowed at least that many).

        Returns the duration of all of them and the requests that finished in the last one;
        per-token outputs are not listed (the simulator needs only times and counts).
        """
        prof = self.profile
        batch = len(self.running)
        one = prof.step_s(batch, 0)
        result = StepResult(duration_s=one * steps, batch=batch, scheduled_tokens=batch * steps)
        self.now_s += result.duration_s
        bs = prof.block_size
        now = self.now_s
        max_len = prof.max_model_len
        for seq in list(self.running):
            computed = seq.computed + steps
            need = -(-computed // bs) - seq.blocks
            if need > 0:
                if need > self.free_blocks:
                    raise RuntimeError("fast_forward beyond the free KV blocks; call decode_run() first")
                self._take_free(need)
                seq.blocks += need
            seq.computed = computed
            seq.generated += steps
            seq.last_token_s = now
            if seq.generated >= seq.target_tokens or seq.prompt_tokens + seq.generated >= max_len:
                self._finish(seq, result)
        return result
