"""What the simulator runs: the stack's spec and plan, and the objects the Pulumi program renders.

The Deployments, ScaledObjects and NodePools come from the same pure renderers the Pulumi
program calls (`infra.components.serving.serving_objects`, `infra.manifests.karpenter`), with the
settings of `Pulumi.<stack>.yaml`, so the simulation reads exactly what `pulumi up` would apply.

The stack's embedding models (`serving.task: embed`) are left out, their pods and their share of
the NodePool limits together (`generation_only`): the engine model is decode steps over KV blocks,
which an embedding engine has neither of.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from apps.core.batching.profile import EngineProfile, profiles_for
from apps.core.errors import SpecError
from apps.core.sizing.fleet import replicas_for_load
from apps.core.sizing.plan import FleetPlan, plan_fleet
from apps.core.sizing.pools import ON_DEMAND_POOL, SPOT_POOL
from apps.core.spec import StackSpec, load_spec
from apps.simulate.autoscale import ScalerSpec, scaler_spec
from infra.components.serving import serving_objects
from infra.config import InfraConfig
from infra.manifests.common import GPU_RESOURCE, SPOT_TAINT_KEY, slug
from infra.manifests.karpenter import gpu_pool_spec, node_pools
from infra.manifests.vllm import deployment_name
from infra.manifests.vllm_target import Capacity

PROJECT_DIR = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class DeploymentSpec:
    name: str
    model: str
    gpus: int
    pools: tuple[str, ...]  # NodePools it may land on, preferred first
    fixed_replicas: int | None  # None: KEDA decides


@dataclass(frozen=True)
class PoolSpec:
    name: str
    capacity: str  # on-demand | spot
    gpu_limit: int
    gpus_per_instance: tuple[int, ...]
    consolidate_after_s: float


@dataclass(frozen=True)
class World:
    spec: StackSpec
    plan: FleetPlan
    infra: InfraConfig
    profiles: dict[str, EngineProfile]
    deployments: dict[str, DeploymentSpec]
    scalers: dict[str, ScalerSpec]  # by Deployment name
    pools: dict[str, PoolSpec]
    left_out: tuple[str, ...] = ()  # the stack's embedding models, not simulated (`generation_only`)


def generation_only(spec: StackSpec) -> StackSpec:
    """The stack without its embedding models (and their peaks): what the simulator runs."""
    kept = {name: m for name, m in spec.models.items() if m.serving.task != "embed"}
    if len(kept) == len(spec.models):
        return spec
    peaks = {name: n for name, n in spec.peak_streams.items() if name in kept}
    return spec.model_copy(update={"models": kept, "peak_streams": peaks})


def _deployments_of(models: tuple[str, ...]) -> set[str]:
    """Every Deployment name a model may have (on-demand, spot burst, canary)."""
    kinds = ((Capacity.ON_DEMAND, False), (Capacity.SPOT, False), (Capacity.ON_DEMAND, True))
    return {deployment_name(m, capacity, canary) for m in models for capacity, canary in kinds}


def infra_config(stack: str) -> InfraConfig:
    path = PROJECT_DIR / f"Pulumi.{stack}.yaml"
    if not path.exists():
        return InfraConfig(stack=stack)
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    values = {
        k.split(":", 1)[1]: str(v) for k, v in (raw.get("config") or {}).items() if k.startswith("llmfleet:")
    }
    return InfraConfig.from_mapping(stack, values)


def _duration_s(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return float(text[:-1]) * units[text[-1]]


def _deployment(obj: dict[str, Any], models_by_slug: dict[str, str]) -> DeploymentSpec:
    pod = obj["spec"]["template"]["spec"]
    vllm = next(c for c in pod["containers"] if c["name"] == "vllm")
    gpus = int(vllm["resources"]["limits"][GPU_RESOURCE])
    spot = any(t.get("key") == SPOT_TAINT_KEY for t in pod.get("tolerations", []))
    return DeploymentSpec(
        name=obj["metadata"]["name"],
        model=models_by_slug[obj["metadata"]["labels"]["llmfleet.io/model"]],
        gpus=gpus,
        pools=(SPOT_POOL, ON_DEMAND_POOL) if spot else (ON_DEMAND_POOL,),
        fixed_replicas=obj["spec"].get("replicas"),
    )


def scalers_from_render(path: str) -> dict[str, ScalerSpec]:
    """The ScaledObjects of an `llmfleet infra render` JSON (e.g. another branch's golden file)."""
    try:
        resources = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise SpecError(f"{path}: cannot read a render: {exc}", param="scaled_objects") from None
    objs = [r["inputs"] for r in resources if r.get("type") == "kubernetes:keda.sh/v1alpha1:ScaledObject"]
    if not objs:
        raise SpecError(f"{path}: no ScaledObject in this render", param="scaled_objects")
    return {s.deployment: s for s in (scaler_spec(o) for o in objs)}


def what_if(world: World, *, scaled_objects: str | None = None, gpu_limit: int | None = None) -> World:
    """The same world with another render's ScaledObjects (those of the models left out ignored) or
    another NodePool GPU limit."""
    scalers = scalers_from_render(scaled_objects) if scaled_objects else world.scalers
    left_out = _deployments_of(world.left_out)
    scalers = {d: s for d, s in scalers.items() if d not in left_out}
    missing = sorted(set(scalers) - set(world.deployments))
    if missing:
        raise SpecError(
            f"--scaled-objects: no Deployment {', '.join(missing)} in this stack", param="scaled_objects"
        )
    pools = world.pools
    if gpu_limit is not None:
        pools = {n: replace(p, gpu_limit=gpu_limit) for n, p in pools.items()}
    return replace(world, scalers=scalers, pools=pools)


def build_world(stack: str) -> World:
    full = load_spec(stack)
    spec = generation_only(full)
    plan = plan_fleet(spec)
    name = Path(stack).stem if stack.endswith((".yaml", ".yml")) else stack
    cfg = infra_config(name)
    objects = serving_objects(spec, plan, cfg.office_hours, "agent", "bucket")
    models_by_slug = {slug(m): m for m in spec.models}
    deployments = {
        d.name: d for d in (_deployment(o, models_by_slug) for o in objects if o["kind"] == "Deployment")
    }
    scalers = {s.deployment: s for s in (scaler_spec(o) for o in objects if o["kind"] == "ScaledObject")}
    pools = {}
    for p in node_pools(gpu_pool_spec(spec)):
        s = p["spec"]
        reqs = {r["key"]: r["values"] for r in s["template"]["spec"]["requirements"]}
        pools[p["metadata"]["name"]] = PoolSpec(
            name=p["metadata"]["name"],
            capacity=reqs["karpenter.sh/capacity-type"][0],
            gpu_limit=int(s["limits"][GPU_RESOURCE]),
            gpus_per_instance=tuple(sorted(int(n) for n in reqs["karpenter.k8s.aws/instance-gpu-count"])),
            consolidate_after_s=_duration_s(s["disruption"]["consolidateAfter"]),
        )
    left_out = tuple(m for m in full.models if m not in spec.models)
    return World(spec, plan, cfg, profiles_for(spec), deployments, scalers, pools, left_out)


def check_models(world: World, models: set[str]) -> None:
    embedding = sorted(models & set(world.left_out))
    if embedding:
        raise SpecError(
            f"the trace names embedding model(s) {', '.join(embedding)}: the simulator runs the generate "
            "models only (docs/simulator.md)",
            param="trace",
        )
    unknown = sorted(models - set(world.spec.models))
    if unknown:
        raise SpecError(
            f"the trace names model(s) {', '.join(unknown)} that stack {world.spec.name!r} does not serve "
            f"(it serves {', '.join(world.spec.models)})",
            param="trace",
        )


def onprem_model(world: World, choice: str | None = "auto") -> str | None:
    """The model the always-present on-premises servers run (`choice` unless "auto").

    Auto: among the models whose replica fits each server exactly, the one whose peak needs the
    on-premises GPUs most closely, counted without `serving.headroom` (the headroom is cloud slack:
    raising a model's headroom must not move the on-premises servers to another model); ties go to
    the model with the higher replica floor (always-on hardware suits always-on load).
    """
    if choice != "auto":
        return choice
    plan, spec = world.plan.models, world.spec
    fits = [m for m, p in plan.items() if all(srv.gpus % p.gpus_per_replica == 0 for srv in spec.onprem)]
    if not fits or not spec.onprem:
        return None

    def bare_gpus(m: str) -> int:
        p = plan[m]
        return replicas_for_load(p.peak_streams, p.streams_target) * p.gpus_per_replica

    return min(fits, key=lambda m: (abs(bare_gpus(m) - spec.onprem_gpus), -plan[m].min_replicas, m))
