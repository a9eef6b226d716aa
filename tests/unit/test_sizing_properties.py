"""Monotonic relations of the sizing arithmetic, checked with hypothesis."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from apps.core.sizing import fleet, kv
from apps.core.sizing.kv import GIB, KIB

contexts = st.integers(min_value=1, max_value=131_072)
gpus = st.sampled_from([1, 2, 4, 8])


def _blocks(gpu_count: int) -> int:
    budget = kv.kv_budget_bytes(
        gpu_memory_bytes=44 * GIB,
        gpus=gpu_count,
        gpu_memory_utilization=0.9,
        weights_bytes=15 * GIB,
        activation_reserve_bytes_per_gpu=2 * GIB,
    )
    return kv.kv_blocks(budget, 128 * KIB)


@given(contexts, contexts)
def test_more_context_never_fits_more_streams(a: int, b: int) -> None:
    short, long_ = sorted((a, b))
    blocks = _blocks(1)
    assert kv.streams_that_fit(blocks, long_) <= kv.streams_that_fit(blocks, short)


@given(gpus, gpus)
def test_more_gpus_give_more_kv_budget(a: int, b: int) -> None:
    few, many = sorted((a, b))
    assert _blocks(many) >= _blocks(few)


@given(
    st.integers(min_value=0, max_value=100_000),
    st.integers(min_value=1, max_value=1024),
    st.floats(min_value=0, max_value=2, allow_nan=False),
)
def test_replicas_never_below_load_over_target(peak: int, target: int, headroom: float) -> None:
    replicas = fleet.replicas_for_load(peak, target, headroom)
    assert replicas * target >= peak
    assert replicas >= fleet.replicas_for_load(peak, target)


@given(st.integers(min_value=1, max_value=10_000), st.integers(min_value=1, max_value=64))
def test_blocks_cover_tokens(tokens: int, block: int) -> None:
    n = kv.blocks_for_tokens(tokens, block)
    assert n * block >= tokens > (n - 1) * block
