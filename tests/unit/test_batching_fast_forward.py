"""`FastScheduler.fast_forward(k)` is exactly `k` calls of `step()` whenever `decode_run()` allows `k`."""

from __future__ import annotations

import random

from apps.core.batching.fastforward import FastScheduler
from apps.core.batching.profile import catalog_profiles
from apps.core.batching.scheduler import Sequence


def _loaded(seed: int) -> FastScheduler:
    rng = random.Random(seed)
    sched = FastScheduler(catalog_profiles("prod")["llama-3.1-8b-instruct"])
    for i in range(rng.randint(5, 40)):
        sched.add(Sequence(f"r{i}", rng.randint(10, 3000), rng.randint(2, 600), "stop", 0.0))
    return sched


def _state(s: FastScheduler) -> list[tuple[str, int, int, int]]:
    return [(q.request_id, q.computed, q.generated, q.blocks) for q in s.running]


def test_fast_forward_equals_stepping() -> None:
    runs = 0
    for seed in range(30):
        a, b = _loaded(seed), _loaded(seed)
        while a.has_work():
            k = a.decode_run()
            if k < 2:
                ra, rb = a.step(), b.step()
                assert [s.request_id for s in ra.finished] == [s.request_id for s in rb.finished]
                continue
            runs += 1
            fast = a.fast_forward(k)
            finished = [s.request_id for _ in range(k) for s in b.step().finished]
            assert [s.request_id for s in fast.finished] == finished
            assert _state(a) == _state(b)
            assert a.free_blocks == b.free_blocks
            assert abs(a.now_s - b.now_s) < 1e-9
        assert not b.has_work()
    assert runs > 30  # the property was exercised, not skipped


def test_no_fast_forward_while_a_request_could_be_admitted() -> None:
    sched = _loaded(1)
    sched.step()
    sched.add(Sequence("late", 100, 10, "stop", sched.now_s))
    assert len(sched.running) < sched.profile.max_num_seqs
    assert sched.decode_run() == 0
