"""Sizing an embedding model (`serving.task: embed`, issue 31): no KV cache, no decode; its memory is
weights plus one step's activations, its replicas follow from prompt tokens per second."""

from __future__ import annotations

import math
from typing import Any

import pytest
import yaml

from apps.core.errors import SpecError
from apps.core.sizing import embed
from apps.core.sizing.kv import GIB
from apps.core.sizing.plan import plan_fleet, with_overrides
from apps.core.spec import STACKS_DIR, load_spec, parse_spec

EMBED = "bge-m3"


def _prod(**serving: Any) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((STACKS_DIR / "prod.yaml").read_text())
    data["models"][EMBED]["serving"].update(serving)
    return data


def test_an_encoder_steps_activations() -> None:
    # 8192 tokens x 14 widths x 1024 x 2 bytes: about a fifth of a GiB for bge-m3's longest input.
    assert embed.encoder_step_activation_bytes(8192, 1024, 2) == 8192 * 14 * 1024 * 2
    assert round(embed.encoder_step_activation_bytes(8192, 1024, 2) / GIB, 2) == 0.22
    assert embed.step_tokens(8192) == 8192  # vLLM raises the step's budget to one whole input
    assert embed.step_tokens(512) == embed.DEFAULT_STEP_TOKENS == 2048
    with pytest.raises(SpecError, match="hidden_size must be greater than 0"):
        embed.encoder_step_activation_bytes(8192, 0, 2)


def test_inputs_in_flight_share_the_rate_within_the_latency() -> None:
    assert embed.inputs_in_flight(40_000, 512, 1.0) == 78  # 78 x 512 / 40,000 = 0.998 s each
    assert embed.inputs_in_flight(40_000, 512, 2.0) == 156
    assert embed.inputs_in_flight(80_000, 512, 1.0) == 156  # twice the rate: twice the inputs
    assert embed.inputs_in_flight(1_000, 8192, 1.0) == 1  # one input alone exceeds it: still one
    assert embed.inputs_in_flight(51_200, 512, 1.0) == 100  # exact, not 99.99999
    with pytest.raises(SpecError, match="planning_context_tokens must be greater than 0"):
        embed.inputs_in_flight(40_000, 0, 1.0)


def test_prod_plans_bge_m3_by_prompt_tokens() -> None:
    plan = plan_fleet(load_spec("prod"))
    m = plan.models[EMBED]
    assert m.task == "embed"
    assert m.embedding_dimensions == 1024
    # No KV cache: nothing of the decoder arithmetic (96 KiB a token for its 24 x 16 x 64) is claimed.
    assert (m.kv_bytes_per_token, m.kv_budget_gib_per_replica, m.kv_blocks_per_replica) == (0, 0.0, 0)
    assert m.gpus_per_replica == 1
    assert m.weights_gib == pytest.approx(0.568e9 * 2 / GIB)  # fp16: 1.06 GiB
    assert m.encoder_activation_gib == pytest.approx(8192 * 14 * 1024 * 2 / GIB)
    assert m.prompt_tokens_per_s_per_replica == 40_000
    assert m.output_tokens_per_s_per_replica == 0.0
    # 78 inputs of 512 tokens share 40,000 tokens/s: each done in 1 s (slo.ttft_p50_s).
    assert (m.streams_target, m.max_num_seqs, m.streams_per_replica) == (78, 78, 78)
    assert m.tokens_per_s_per_stream == pytest.approx(40_000 / 78)
    assert m.queue.service_time_s == pytest.approx(78 * 512 / 40_000)
    assert m.queue.requests_per_s_per_replica == pytest.approx(40_000 / 512)
    # 100 inputs in flight x 1.25 headroom / 78 -> 2 replicas of 1 GPU.
    assert (m.peak_streams, m.replicas, m.gpus, m.min_replicas, m.max_replicas) == (100, 2, 2, 1, 3)
    # One L40S at 2.5 USD/h embedding 144 M tokens an hour.
    assert m.cost_per_million_tokens_usd["full"] == pytest.approx(2.5 / 144)
    assert m.cost_per_million_tokens_usd["half"] == pytest.approx(5.0 / 144)
    assert m.prompt_microcredits_per_million == 50_000
    assert m.warnings == ()


def test_the_replicas_follow_prompt_tokens_per_second() -> None:
    """Replicas = peak prompt tokens/s x (1 + headroom) / tokens/s per replica, the peak's tokens/s
    being its inputs in flight each done within the median TTFT target (Little's law)."""
    spec = load_spec("prod")
    # Rates whose per-replica inputs are whole (51,200 x 1 s / 512 = 100), so no flooring hides a miss.
    for rate, inputs, replicas in ((51_200, 100, 2), (25_600, 100, 3), (51_200, 400, 5), (12_800, 250, 13)):
        variant = with_overrides(
            parse_spec(_prod(prompt_tokens_per_s_per_replica=rate), "x.yaml"), peak_streams={EMBED: inputs}
        )
        m = plan_fleet(variant).models[EMBED]
        peak_tokens_per_s = inputs * 512 / spec.slo.ttft_p50_s
        assert m.replicas == math.ceil(round(peak_tokens_per_s * 1.25 / rate, 9)) == replicas
    slow = plan_fleet(parse_spec(_prod(prompt_tokens_per_s_per_replica=10_000), "x.yaml")).models[EMBED]
    fast = plan_fleet(spec).models[EMBED]
    assert (slow.replicas, fast.replicas) == (7, 2)  # a quarter of the rate: 19 inputs a replica, not 78


def test_a_longer_mean_input_needs_more_replicas() -> None:
    base = plan_fleet(load_spec("prod")).models[EMBED]
    long_inputs = plan_fleet(parse_spec(_prod(planning_context_tokens=2048), "x.yaml")).models[EMBED]
    assert long_inputs.streams_target == 19  # 40,000 x 1 s / 2,048
    assert long_inputs.replicas == math.ceil(100 * 1.25 / 19) > base.replicas
    assert any("outside [1, 3]" in w for w in long_inputs.warnings)


def test_an_explicit_target_is_kept_and_its_latency_checked() -> None:
    m = plan_fleet(parse_spec(_prod(streams_per_replica=64), "x.yaml")).models[EMBED]
    assert (m.streams_target, m.max_num_seqs) == (64, 64)
    assert m.warnings == ()
    crowded = plan_fleet(parse_spec(_prod(streams_per_replica=400), "x.yaml")).models[EMBED]
    # 400 x 512 / 40,000 = 5.1 s per input: above the p95 TTFT target (3 s).
    assert any("takes 5.1 s when 400 share 40,000 tokens/s" in w for w in crowded.warnings)


def test_weights_and_activations_must_fit() -> None:
    data = _prod()
    data["models"][EMBED]["parameters_b"] = 45.0  # 84 GiB of fp16 weights: two L40S cannot hold them
    spec = parse_spec(data, "x.yaml")
    assert plan_fleet(spec).models[EMBED].gpus_per_replica == 4  # the smallest power of two holding them
    data["models"][EMBED]["serving"]["tensor_parallel_size"] = 1
    with pytest.raises(SpecError, match=r"do not fit in 39\.6 GiB usable on 1 GPU"):
        plan_fleet(parse_spec(data, "x.yaml"))
    data = _prod()
    data["sizing"]["activation_reserve_gib_per_gpu"] = 0.1  # less than one 8192-token step needs
    with pytest.raises(SpecError, match=r"activation_reserve_gib_per_gpu: one step of models\.bge-m3"):
        plan_fleet(parse_spec(data, "x.yaml"))


def test_the_generate_models_are_not_moved_by_it() -> None:
    """The three chat models' numbers are the brief's with or without the embedding model."""
    with_it = plan_fleet(load_spec("prod"))
    data: dict[str, Any] = yaml.safe_load((STACKS_DIR / "prod.yaml").read_text())
    del data["models"][EMBED]
    del data["peak_streams"][EMBED]
    without = plan_fleet(parse_spec(data, "x.yaml"))
    for name, m in without.models.items():
        assert with_it.models[name] == m
    assert with_it.gpus_peak == without.gpus_peak + with_it.models[EMBED].gpus


def test_what_ifs_leave_the_prefix_cache_of_an_embedding_model_alone() -> None:
    spec = with_overrides(load_spec("prod"), prefix_hit_rate=0.5)
    assert spec.models["llama-3.1-8b-instruct"].serving.prefix_hit_rate == 0.5
    assert spec.models[EMBED].serving.prefix_hit_rate == 0.0
