"""GPU demand per Karpenter NodePool: the arithmetic the NodePool `nvidia.com/gpu` limits come from.

A pool's limit caps the GPUs of all its nodes, and a node counts all its GPUs: a TP=2 replica on
a 4-GPU g6e node (there is no 2-GPU size) uses the node's 4 unless a second replica shares it.
So a model's demand on a pool is `nodes x GPUs per node`, with the smallest instance size that
holds one replica, packed `size // gpus_per_replica` replicas to a node, at its replica maximum.
The on-demand pool serves every model (the spot model's floor, and its burst when spot is short)
and every canary (`ModelSpec.canary`, at its own replica maximum, on nodes of its own);
the spot pool only the spot model's burst Deployment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from apps.core.errors import SpecError
from apps.core.sizing.plan import FleetPlan
from apps.core.spec import StackSpec

ON_DEMAND_POOL = "gpu-l40s"
SPOT_POOL = "gpu-l40s-spot"


@dataclass(frozen=True)
class PoolDemand:
    pool: str
    gpus: int  # the NodePool limit
    per_model: dict[str, int]
    cap: int | None  # the stack's `gpu_pool_caps` entry, if any

    @property
    def headroom(self) -> int | None:
        return None if self.cap is None else self.cap - self.gpus


def spot_burst_max(spec: StackSpec, plan: FleetPlan, model: str) -> int:
    """Replica maximum of the spot model's burst Deployment (the rest of its maximum above the floor)."""
    mp = plan.models[model]
    base = max(spec.models[model].serving.on_demand_min_replicas, mp.min_replicas)
    return max(mp.max_replicas - base, 1)


def _gpus(spec: StackSpec, plan: FleetPlan, model: str, replicas: int) -> int:
    gpu = spec.gpu_types[spec.models[model].serving.gpu_type]
    per_replica = plan.models[model].gpus_per_replica
    size = min((n for n in gpu.gpus_per_instance if n >= per_replica), default=None)
    if size is None:
        raise SpecError(
            f"models.{model}: {per_replica} GPUs per replica exceed the largest "
            f"{gpu.instance_family} size ({max(gpu.gpus_per_instance)} GPUs)",
            param="stack",
        )
    return math.ceil(replicas / (size // per_replica)) * size


def pool_demand(spec: StackSpec, plan: FleetPlan) -> list[PoolDemand]:
    on_demand: dict[str, int] = {}
    spot: dict[str, int] = {}
    for name in spec.models:
        on_demand[name] = _gpus(spec, plan, name, plan.models[name].max_replicas)
        canary = spec.models[name].canary
        if canary is not None:
            on_demand[name] += _gpus(spec, plan, name, canary.max_replicas)
        if spec.models[name].serving.spot:
            spot[name] = _gpus(spec, plan, name, spot_burst_max(spec, plan, name))
    pools = [(ON_DEMAND_POOL, on_demand)] + ([(SPOT_POOL, spot)] if spot else [])
    return [PoolDemand(p, sum(m.values()), m, spec.gpu_pool_caps.get(p)) for p, m in pools]


def check_pool_caps(demands: list[PoolDemand]) -> None:
    """A pool whose replica maxima need more GPUs than the stack allows it is a spec error."""
    for d in demands:
        if d.cap is not None and d.gpus > d.cap:
            parts = ", ".join(f"{m} {g}" for m, g in d.per_model.items())
            raise SpecError(
                f"gpu_pool_caps.{d.pool}: the replica maxima need {d.gpus} nvidia.com/gpu ({parts}), "
                f"more than the cap of {d.cap}; lower replicas.max or raise the cap",
                param="stack",
            )
