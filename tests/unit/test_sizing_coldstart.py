"""A model's expected load time from zero: weights over the stack's cache bandwidth plus engine start."""

from __future__ import annotations

import pytest

from apps.core.sizing import kv
from apps.core.sizing.coldstart import load_time_s, model_load_times_s
from apps.core.spec import load_spec


def test_load_time_is_weights_over_cache_bandwidth_plus_engine_start() -> None:
    assert load_time_s(64.0, 2.0, 60.0) == 92.0
    with pytest.raises(ValueError):
        load_time_s(64.0, 0.0, 60.0)


def test_the_stacks_models_load_times() -> None:
    spec = load_spec("dev")
    times = model_load_times_s(spec)
    assert set(times) == set(spec.models)
    seventy = spec.models["llama-3.3-70b-instruct-fp8"]
    weights_gib = kv.weights_bytes(seventy.parameters_b * 1e9, seventy.weight_dtype) / kv.GIB
    assert times["llama-3.3-70b-instruct-fp8"] == pytest.approx(
        weights_gib / spec.sizing.cache_gib_per_s + spec.sizing.engine_start_s
    )
    # Bigger weights take longer; every one is longer than the 30 s queue limit (a 503 + Retry-After).
    assert times["llama-3.1-8b-instruct"] < times["qwen2.5-32b-instruct"]
    assert min(times.values()) > spec.slo.queue_limit_s
