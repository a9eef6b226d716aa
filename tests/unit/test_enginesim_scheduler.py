"""The simulated scheduler in simulated time: calibration against the brief, batching, KV blocks, preemption."""

from __future__ import annotations

from dataclasses import replace

import pytest

from apps.core.batching.scheduler import Scheduler, SeqState, Sequence
from apps.core.errors import SpecError
from apps.core.sizing.plan import plan_fleet
from apps.core.spec import load_spec
from apps.enginesim.profiles import TINY, EngineProfile, catalog_profiles, get_profile

EIGHT_B = "llama-3.1-8b-instruct"


def _run(
    profile: EngineProfile, streams: int, prompt: int = 100, out: int = 400
) -> tuple[Scheduler, list[Sequence]]:
    sched = Scheduler(profile)
    seqs = [Sequence(f"r{i}", prompt, out, "length", arrival_s=0.0) for i in range(streams)]
    for s in seqs:
        sched.add(s)
    for _ in range(100_000):
        if not sched.has_work():
            break
        sched.step()
    assert not sched.has_work()
    return sched, seqs


def _rates(seqs: list[Sequence]) -> tuple[float, float]:
    """Per-stream decode rate (mean) and replica output rate over the decode window."""
    firsts = [s.first_token_s for s in seqs if s.first_token_s is not None]
    lasts = [s.last_token_s for s in seqs if s.last_token_s is not None]
    assert len(firsts) == len(lasts) == len(seqs)
    per_stream = [
        (s.generated - 1) / (last - first) for s, first, last in zip(seqs, firsts, lasts, strict=True)
    ]
    start, end = min(firsts), max(lasts)
    total = sum(s.generated for s in seqs) / (end - start)
    return sum(per_stream) / len(per_stream), total


def test_8b_profile_matches_the_brief_at_32_streams() -> None:
    _, seqs = _run(get_profile(EIGHT_B), 32)
    per_stream, total = _rates(seqs)
    assert per_stream == pytest.approx(46.875, rel=0.03)  # "about 47 tokens/s per stream"
    assert total == pytest.approx(1500, rel=0.03)  # "about 1,500 output tokens/s per replica"


def test_batching_trades_per_stream_speed_for_throughput() -> None:
    prof = get_profile(EIGHT_B)
    one = _rates(_run(prof, 1)[1])
    thirty_two = _rates(_run(prof, 32)[1])
    sixty_four = _rates(_run(prof, 64)[1])
    assert one[0] > thirty_two[0] > sixty_four[0]
    assert one[1] < thirty_two[1] < sixty_four[1]


def test_kv_blocks_come_from_the_planner() -> None:
    plan = plan_fleet(load_spec("prod"))
    profiles = catalog_profiles("prod")
    spec = load_spec("prod")
    for name, mp in plan.models.items():
        if spec.models[name].serving.task == "embed":
            # No KV cache in vLLM for an encoder (0 blocks planned); enginesim still places one longest
            # prompt in blocks while it embeds it (and the null block).
            assert mp.kv_blocks_per_replica == 0
            assert (profiles[name].num_blocks - 1) * profiles[name].block_size == mp.max_model_len
        else:
            assert profiles[name].num_blocks == mp.kv_blocks_per_replica
        assert profiles[name].max_num_seqs == mp.max_num_seqs
        assert profiles[name].max_model_len == mp.max_model_len


def test_bigger_models_are_slower_per_stream() -> None:
    profiles = catalog_profiles("prod")
    at_one = {name: p.decode_tokens_per_s_per_stream(1) for name, p in profiles.items()}
    assert at_one[EIGHT_B] > at_one["qwen2.5-32b-instruct"] > at_one["llama-3.3-70b-instruct-fp8"]
    assert profiles["qwen2.5-32b-instruct"].decode_tokens_per_s_per_stream(16) == pytest.approx(40.0)
    assert profiles["llama-3.3-70b-instruct-fp8"].decode_tokens_per_s_per_stream(8) == pytest.approx(37.5)


def test_max_num_seqs_caps_the_running_batch() -> None:
    sched = Scheduler(replace(TINY, max_num_seqs=4))
    for i in range(10):
        sched.add(Sequence(f"r{i}", 10, 50, "length", 0.0))
    sched.step()
    assert len(sched.running) == 4
    assert len(sched.waiting) == 6


def test_prefill_costs_time_per_prompt_token() -> None:
    prof = get_profile(EIGHT_B)
    ttft = {}
    for prompt in (100, 1900):
        _, seqs = _run(prof, 1, prompt=prompt, out=2)
        first = seqs[0].first_token_s
        assert first is not None
        ttft[prompt] = first
    assert ttft[1900] - ttft[100] == pytest.approx(1800 * prof.prefill_s_per_token)


def test_long_prompt_is_prefilled_in_chunks() -> None:
    sched = Scheduler(get_profile(EIGHT_B))
    seq = Sequence("long", 5000, 3, "length", 0.0)
    sched.add(seq)
    steps = 0
    while seq.first_token_s is None:
        sched.step()
        steps += 1
    assert steps == 3  # 2048 + 2048 + 904 prompt tokens per step


def test_preemption_recomputes_and_everything_finishes() -> None:
    prof = replace(TINY, num_blocks=11, max_model_len=160)  # 10 usable blocks = 160 tokens
    sched, seqs = _run(prof, 3, prompt=30, out=60)
    assert sched.num_preemptions > 0
    assert all(s.generated == 60 and s.state is SeqState.FINISHED for s in seqs)
    assert sched.used_blocks == 0


def test_abort_frees_blocks_at_once() -> None:
    sched = Scheduler(TINY)
    sched.add(Sequence("a", 100, 500, "length", 0.0))
    sched.step()
    assert sched.used_blocks > 0
    assert sched.kv_cache_usage > 0
    sched.abort("a")
    assert sched.used_blocks == 0
    assert not sched.has_work()


def test_context_end_finishes_with_length() -> None:
    _sched, seqs = _run(replace(TINY, max_model_len=64), 1, prompt=60, out=100)
    assert seqs[0].generated == 4  # 60 + 4 = max_model_len


def test_unknown_profile_lists_the_known_ones() -> None:
    with pytest.raises(
        SpecError, match=r"unknown profile 'nope' \(known profiles: .*llama-3.1-8b-instruct.*tiny"
    ):
        get_profile("nope")


def test_overrides_are_validated() -> None:
    with pytest.raises(SpecError, match="max_model_len"):
        TINY.with_overrides(num_blocks=4, max_model_len=1024)
