"""How long a model takes to become ready from zero: the `Retry-After` of a request that meets
a loading model (pure; the orchestrator and the planner use the same numbers).

A replica that starts loads its weights from the node's model cache (local NVMe, filled by
`llmfleet modelsync`) at `cache_gib_per_s`, then the engine starts (CUDA graphs, warm-up:
`engine_start_s`). The same two terms as `apps/simulate` (`nvme_gib_per_s`, `engine_start_s`).
"""

from __future__ import annotations

from apps.core.sizing import kv
from apps.core.spec import StackSpec


def load_time_s(weights_gib: float, cache_gib_per_s: float, engine_start_s: float) -> float:
    if weights_gib <= 0 or cache_gib_per_s <= 0 or engine_start_s < 0:
        raise ValueError("weights_gib and cache_gib_per_s must be positive, engine_start_s not negative")
    return weights_gib / cache_gib_per_s + engine_start_s


def model_load_times_s(spec: StackSpec) -> dict[str, float]:
    """Each model's expected load time from the stack: its weights and the stack's cache bandwidth."""
    out: dict[str, float] = {}
    for name, model in spec.models.items():
        weights_gib = kv.weights_bytes(model.parameters_b * 1e9, model.weight_dtype) / kv.GIB
        out[name] = load_time_s(weights_gib, spec.sizing.cache_gib_per_s, spec.sizing.engine_start_s)
    return out
