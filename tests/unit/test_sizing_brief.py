"""Every number of the design brief's sizing sections, reproduced by the sizing library
(rounded as the brief rounds), plus the second worked example."""

from __future__ import annotations

import pytest

from apps.core.sizing import fleet, kv
from apps.core.sizing.kv import GIB, KIB, MIB
from apps.core.sizing.plan import plan_fleet
from apps.core.spec import load_spec

L40S = 44 * GIB


def test_kv_bytes_per_token_8b_is_128_kib() -> None:
    assert kv.kv_bytes_per_token(32, 8, 128, 2) == 131_072 == 128 * KIB


def test_kv_for_2k_and_8k_contexts() -> None:
    per_token = kv.kv_bytes_per_token(32, 8, 128, 2)
    assert kv.kv_bytes_for_context(per_token, 2048) == 256 * MIB
    assert kv.kv_bytes_for_context(per_token, 8192) == 1 * GIB


def test_l40s_kv_budget_and_streams() -> None:
    assert round(L40S * 0.9 / GIB, 1) == 39.6
    weights = kv.weights_bytes(8.03e9, "bf16")
    assert round(weights / GIB) == 15
    budget = kv.kv_budget_bytes(
        gpu_memory_bytes=L40S,
        gpus=1,
        gpu_memory_utilization=0.9,
        weights_bytes=weights,
        activation_reserve_bytes_per_gpu=2 * GIB,
    )
    assert round(budget / GIB, 1) == 22.6
    blocks = kv.kv_blocks(budget, 128 * KIB)
    assert kv.streams_that_fit(blocks, 2048) == 90  # "about 90 streams at 2k"
    assert kv.streams_that_fit(blocks, 8192) == 22  # "only 22 at 8k"


def test_brief_fleet_from_prod_spec() -> None:
    plan = plan_fleet(load_spec("prod"))
    m8, m32, m70 = (
        plan.models["llama-3.1-8b-instruct"],
        plan.models["qwen2.5-32b-instruct"],
        plan.models["llama-3.3-70b-instruct-fp8"],
    )
    assert (m8.replicas, m8.gpus_per_replica, m8.gpus) == (6, 1, 6)
    assert (m32.replicas, m32.gpus_per_replica, m32.gpus) == (4, 2, 8)
    assert (m70.replicas, m70.gpus_per_replica, m70.gpus) == (2, 4, 8)
    # The brief's 22 GPUs for its three chat models, plus the embedding model's 2 (issue 31).
    assert m8.gpus + m32.gpus + m70.gpus == 22
    assert plan.models["bge-m3"].gpus == 2
    assert (plan.gpus_peak, plan.gpus_onprem, plan.gpus_cloud) == (24, 8, 16)
    assert plan.cost_per_hour_peak_usd == pytest.approx(40.0)
    # The brief's average of 8 cloud GPUs plus the embedding model's always-on one: 9 x 2.5 x 730.
    assert plan.cost_per_month_usd == pytest.approx(16_425.0)
    # vLLM flags of the brief's 8B Deployment come from the same numbers.
    assert (m8.max_model_len, m8.max_num_seqs) == (8192, 64)
    assert plan.warnings == []


def test_replicas_per_model_from_load() -> None:
    assert fleet.replicas_for_load(140, 32) == 5  # 140 / 32 = 4.4 ...
    assert fleet.replicas_for_load(140, 32, headroom=0.3) == 6  # ... 6 with the hot model's headroom
    assert fleet.replicas_for_load(50, 16) == 4  # 50 / 16 = 3.1
    assert fleet.replicas_for_load(10, 8) == 2


def test_cost_per_hour_and_month() -> None:
    assert fleet.cost_per_hour(14, 2.5) == pytest.approx(35.0)
    assert fleet.cost_per_month(8, 2.5) == pytest.approx(14_600.0)


def test_cost_per_million_tokens() -> None:
    assert fleet.tokens_per_hour(1500) == pytest.approx(5.4e6)
    assert round(fleet.cost_per_million_tokens(1, 2.5, 1500), 2) == 0.46
    assert round(fleet.cost_per_million_tokens(1, 2.5, 1500, utilisation=0.5), 2) == 0.93
    assert round(fleet.cost_per_million_tokens(4, 2.5, 300), 1) == 9.3


def test_queue_budget() -> None:
    q = fleet.queue_budget(400, 47, 32, 30)
    assert round(q.service_time_s, 1) == 8.5
    assert round(q.requests_per_s_per_replica, 1) == 3.8
    assert round(q.burst_per_replica, -1) == 110


def test_second_worked_example() -> None:
    # 80 GB GPU, 16 GB weights, 4 GB reserve, 4,096 context -> 120 sequences.
    budget = kv.kv_budget_bytes(
        gpu_memory_bytes=80 * GIB,
        gpus=1,
        gpu_memory_utilization=1.0,
        weights_bytes=16 * GIB,
        activation_reserve_bytes_per_gpu=4 * GIB,
    )
    blocks = kv.kv_blocks(budget, 128 * KIB)
    assert kv.streams_that_fit(blocks, 4096) == 120
    # 200 streams at 20 tokens/s, 120 sequences per GPU, 30 % headroom -> 3 GPUs.
    gpus = fleet.replicas_for_load(200, 120, headroom=0.3)
    assert gpus == 3
    assert fleet.cost_per_month(gpus, 4.0) == pytest.approx(8_760.0)
    tokens_per_s = 200 * 20
    assert round(fleet.cost_per_million_tokens(gpus, 4.0, tokens_per_s), 2) == 0.83
    assert round(fleet.cost_per_million_tokens(gpus, 4.0, tokens_per_s, utilisation=0.5), 2) == 1.67


def test_tensor_parallel_is_smallest_power_of_two_that_fits() -> None:
    common = {
        "gpu_memory_bytes": L40S,
        "gpu_memory_utilization": 0.9,
        "activation_reserve_bytes_per_gpu": 2 * GIB,
    }
    per_token_32b = kv.kv_bytes_per_token(64, 8, 128, 2)
    assert kv.tensor_parallel_size(weights_bytes=64e9, min_kv_bytes=16 * 2048 * per_token_32b, **common) == 2
    per_token_70b = kv.kv_bytes_per_token(80, 8, 128, 2)
    weights_70b = kv.weights_bytes(70.6e9, "fp8")
    assert (
        kv.tensor_parallel_size(weights_bytes=weights_70b, min_kv_bytes=8 * 8192 * per_token_70b, **common)
        == 4
    )
    assert kv.tensor_parallel_size(weights_bytes=15 * GIB, min_kv_bytes=8 * GIB, **common) == 1


def test_kv_cache_usage_perc_excludes_the_null_block() -> None:
    assert kv.kv_cache_usage_perc(0, 101) == 0.0
    assert kv.kv_cache_usage_perc(50, 101) == 0.5
    assert kv.kv_cache_usage_perc(100, 101) == 1.0
    assert kv.blocks_for_tokens(17) == 2
