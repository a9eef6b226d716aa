"""One replica's engine in simulated time: the shared `apps.core.batching` scheduler, stepped by events.

A busy engine has one scheduled wake-up, at the end of its current step. Where the scheduler says
the next steps are identical decode steps (`decode_run`), the engine takes them as one segment
(`fast_forward`) and wakes once at its end; a request that arrives meanwhile cuts the segment after
the step in progress, exactly where a step-by-step engine would have admitted it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from apps.core.batching.scheduler import Scheduler, Sequence, StepResult
from apps.simulate.fleet import Pod

Schedule = Callable[[float, Pod], None]


def wake(pod: Pod, schedule: Schedule) -> StepResult | None:
    """The wake-up at the end of a step or segment: its result (to deliver), then the next one planned."""
    eng = pod.engine
    result: StepResult | None
    if pod.segment is not None:
        result = eng.fast_forward(pod.segment[2])
        pod.segment = None
    else:
        result, pod.pending = pod.pending, None
    return result


def plan(pod: Pod, schedule: Schedule) -> None:
    """At a step boundary (`engine.now_s`): a decode segment, one step, or idle."""
    eng = pod.engine
    if not eng.has_work():
        pod.busy = False
        return
    pod.busy = True
    pod.version += 1
    run = eng.decode_run()
    if run >= 2:
        one = eng.profile.step_s(len(eng.running), 0)
        pod.segment = (eng.now_s, one, run)
        schedule(eng.now_s + one * run, pod)
        return
    pod.pending = eng.step()
    schedule(eng.now_s, pod)


def add(pod: Pod, seq: Sequence, now: float, schedule: Schedule) -> None:
    eng = pod.engine
    if pod.segment is not None:
        start, one, steps = pod.segment
        done = math.floor((now - start) / one) + 1  # steps finished or in progress at `now`
        if done < steps:
            pod.segment = None
            eng.fast_forward(done)  # no request ends before the segment's last step
            eng.add(seq)
            pod.version += 1
            schedule(eng.now_s, pod)  # a boundary with nothing to deliver: plan() runs there
            return
        eng.add(seq)  # joins after the segment's last step, which is the scheduled wake-up
        return
    eng.add(seq)
    if not pod.busy:
        eng.advance_to(now)
        plan(pod, schedule)


def shared_prefix(prompt_tokens: int, hit_rate: float, engine: Scheduler) -> tuple[int, ...]:
    """The block hashes that model a fleet whose engines find `hit_rate` of prompt tokens cached: the
    first `hit_rate` share of a prompt's full blocks is the start of one chain every request to the
    engine shares (computed once, then found in its prefix cache while it stays there), the rest is
    left unhashed (never found: the request's own text). Nothing when `hit_rate` is 0."""
    if hit_rate <= 0:
        return ()
    size = engine.profile.block_size
    return tuple(range(min(prompt_tokens // size, round(hit_rate * prompt_tokens / size))))
