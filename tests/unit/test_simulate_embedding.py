"""`llmfleet simulate` and an embedding model (issue 31): the simulator's engines are decode steps over
KV blocks, which an embedding engine has neither of, so the stack's embedding models are left out,
their pods and their share of the NodePool limits together."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.core.errors import SpecError
from apps.core.sizing.plan import plan_fleet
from apps.core.sizing.pools import ON_DEMAND_POOL, pool_demand
from apps.core.spec import load_spec
from apps.simulate.world import build_world, check_models, generation_only, what_if

EMBED = "bge-m3"
GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "infra" / "prod.golden.json"


def test_the_world_leaves_the_embedding_model_out_with_its_gpus() -> None:
    world = build_world("prod")
    assert world.left_out == (EMBED,)
    assert EMBED not in world.spec.models
    assert EMBED not in world.plan.models
    assert EMBED not in world.spec.peak_streams
    assert all(d.model != EMBED for d in world.deployments.values())
    assert not any(EMBED in name for name in world.scalers)
    full = load_spec("prod")
    (demand,) = [d for d in pool_demand(full, plan_fleet(full)) if d.pool == ON_DEMAND_POOL]
    # The cluster's limit holds its replica maximum; the simulated pool is that much smaller.
    assert world.pools[ON_DEMAND_POOL].gpu_limit == demand.gpus - demand.per_model[EMBED]
    assert set(world.plan.models) == {n for n, m in full.models.items() if m.serving.task == "generate"}


def test_a_stack_without_embedding_models_is_unchanged() -> None:
    spec = generation_only(load_spec("prod"))
    assert generation_only(spec) is spec


def test_a_trace_naming_the_embedding_model_is_refused() -> None:
    world = build_world("prod")
    with pytest.raises(SpecError, match=r"embedding model\(s\) bge-m3: the simulator runs the generate"):
        check_models(world, {"llama-3.1-8b-instruct", EMBED})
    check_models(world, {"llama-3.1-8b-instruct"})  # the generate models are simulated as before


def test_the_current_render_s_scaled_objects_apply_without_the_embedding_ones() -> None:
    """`--scaled-objects` with a render that has the embedding model's ScaledObject (the golden file)."""
    assert '"vllm-bge-m3"' in GOLDEN.read_text(encoding="utf-8")
    world = build_world("prod")
    again = what_if(world, scaled_objects=str(GOLDEN))
    assert set(again.scalers) == set(world.scalers)
