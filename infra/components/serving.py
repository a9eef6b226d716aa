"""Model serving: per model the vLLM Deployment(s) with the agent sidecar, Service, PDBs and
KEDA ScaledObjects, plus the model-sync service account (IRSA: reads the model bucket only).

A model with a canary (`ModelSpec.canary`) has one Deployment more, with its own PDB and ScaledObject:
`vllm-<model>-canary`, the canary revision copied, served and registered, on on-demand capacity."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pulumi

from apps.core.sizing.plan import FleetPlan, ModelPlan
from apps.core.spec import Canary, Serving, StackSpec
from infra.components.irsa import irsa_role
from infra.components.kube import KubeObject
from infra.config import OfficeHours
from infra.manifests import keda, vllm
from infra.manifests.common import NAMESPACE, Manifest, meta
from infra.manifests.iam import model_sync_read
from infra.manifests.vllm_target import Capacity, VllmTarget


@dataclass(frozen=True)
class ServingArgs:
    spec: StackSpec
    plan: FleetPlan
    vllm_image: pulumi.Input[str]  # the ECR mirror of upstream's image (docker/vllm.Dockerfile)
    agent_image: pulumi.Input[str]
    model_sync_image: pulumi.Input[str]
    model_bucket: pulumi.Input[str]
    model_bucket_arn: pulumi.Input[str]
    model_signing_key_arn: pulumi.Input[str]  # model-sync verifies each revision's manifest with it
    oidc_provider_arn: pulumi.Input[str]
    oidc_provider_url: pulumi.Input[str]
    office_hours: OfficeHours
    provider: pulumi.ProviderResource
    # The KEDA and Prometheus-operator releases: their CRDs must exist before our objects.
    depends_on: list[pulumi.Resource]
    # False until the weights are in the bucket (docs/deploy.md: create -> upload -> scale).
    scale_models: bool = False


def serving_objects(
    spec: StackSpec,
    plan: FleetPlan,
    office_hours: OfficeHours,
    agent_image: str,
    bucket: str,
    scale_models: bool = True,
) -> list[Manifest]:
    """Every Kubernetes object of the serving plane, from the spec and the plan (pure)."""
    objects: list[Manifest] = []
    for name, model in spec.models.items():
        mp = plan.models[name]
        serving = model.serving
        target = VllmTarget(
            plan=mp,
            revision=model.revision,
            vllm_image="",
            agent_image=agent_image,
            model_bucket=bucket,
            block_size=spec.sizing.block_size,
        )
        objects.append(vllm.service(name))
        scaling = _model_scaling(spec, target, mp, serving, office_hours, scale_models, objects)
        if model.canary is not None:
            scaling = _with_canary(spec, target, model.canary, scaling, objects)
        objects.extend(keda.scaled_object(s) for s in scaling)
    return objects


def _with_canary(
    spec: StackSpec,
    stable: VllmTarget,
    canary: Canary,
    scaling: list[keda.ScalingTarget],
    objects: list[Manifest],
) -> list[keda.ScalingTarget]:
    """The canary's Deployment and PDB (appended to `objects`), and what KEDA scales: the stable
    Deployments on the model's demand less the canary's pods, the canary on its own pods' load."""
    target = replace(stable, revision=canary.revision, canary=True)
    name = vllm.deployment_name(target.plan.name, Capacity.ON_DEMAND, canary=True)
    objects.append(vllm.deployment(target, Capacity.ON_DEMAND, replicas=0))
    objects.append(vllm.pdb(target.plan.name, Capacity.ON_DEMAND, canary=True))
    others = keda.pod_matcher(name, own=False)
    own = keda.ScalingTarget(
        name,
        target.plan,
        canary.min_replicas,
        canary.max_replicas,
        spec.slo.queue_wait_p95_s,
        headroom=spec.models[target.plan.name].serving.headroom,
        pods=keda.pod_matcher(name),
        orchestrator_terms=False,
    )
    return [*(replace(s, pods=others) for s in scaling), own]


def _model_scaling(
    spec: StackSpec,
    target: VllmTarget,
    mp: ModelPlan,
    serving: Serving,
    office_hours: OfficeHours,
    scale_models: bool,
    objects: list[Manifest],
) -> list[keda.ScalingTarget]:
    """One model's Deployments and PDBs (appended to `objects`) and what KEDA scales: with spot, a
    warm on-demand floor and the spot burst on top; without, one on-demand Deployment."""
    name = target.plan.name
    scaling: list[keda.ScalingTarget] = []
    if serving.spot:
        # Warm floor on on-demand capacity (spot reclaims must not take the floor), spot on top.
        base = max(serving.on_demand_min_replicas, mp.min_replicas)
        # Not KEDA's: the stack's floor once the weights are there, 0 before.
        objects.append(vllm.deployment(target, Capacity.ON_DEMAND, replicas=base if scale_models else 0))
        objects.append(vllm.pdb(name, Capacity.ON_DEMAND))
        burst = vllm.deployment_name(name, Capacity.SPOT)
        objects.append(vllm.deployment(target, Capacity.SPOT, replicas=0))
        objects.append(vllm.pdb(name, Capacity.SPOT))
        scaling.append(
            keda.ScalingTarget(
                burst,
                mp,
                0,
                max(mp.max_replicas - base, 1),
                spec.slo.queue_wait_p95_s,
                office_hours=office_hours,
                office_hours_replicas=serving.office_hours_warm_replicas,
                base_replicas=base,
                headroom=serving.headroom,
            )
        )
    else:
        objects.append(vllm.deployment(target, Capacity.ON_DEMAND, replicas=0))
        objects.append(vllm.pdb(name, Capacity.ON_DEMAND))
        scaling.append(
            keda.ScalingTarget(
                vllm.deployment_name(name, Capacity.ON_DEMAND),
                mp,
                mp.min_replicas,
                mp.max_replicas,
                spec.slo.queue_wait_p95_s,
                office_hours=office_hours,
                office_hours_replicas=serving.office_hours_warm_replicas,
                headroom=serving.headroom,
            )
        )
    return scaling


class ModelServing(pulumi.ComponentResource):
    def __init__(self, name: str, args: ServingArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:infra:ModelServing", name, None, opts)
        # Explicit per child: a component's depends_on does not reach its children.
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=args.depends_on)
        role = irsa_role(
            f"{name}-model-sync",
            oidc_provider_arn=args.oidc_provider_arn,
            oidc_provider_url=args.oidc_provider_url,
            namespace=NAMESPACE,
            service_account=vllm.MODEL_SYNC_SERVICE_ACCOUNT,
            policy=pulumi.Output.all(args.model_bucket_arn, args.model_signing_key_arn).apply(
                lambda arns: model_sync_read(arns[0], arns[1])
            ),
            parent=self,
        )
        sa: Manifest = {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {
                **meta(vllm.MODEL_SYNC_SERVICE_ACCOUNT, "model-sync"),
                "annotations": {"eks.amazonaws.com/role-arn": role.arn},
            },
        }
        KubeObject(sa, k8s_opts)
        # Images and bucket are outputs; the renderer works on placeholders we swap in here.
        objects = serving_objects(
            args.spec, args.plan, args.office_hours, "@AGENT_IMAGE@", "@MODEL_BUCKET@", args.scale_models
        )
        keda_targets = {o["spec"]["scaleTargetRef"]["name"] for o in objects if o["kind"] == "ScaledObject"}
        # A KEDA target's count belongs to KEDA after create: Pulumi sets 0 once, never resets it.
        gpu_opts = pulumi.ResourceOptions.merge(
            k8s_opts, pulumi.ResourceOptions(ignore_changes=["spec.replicas"])
        )
        for obj in objects:
            obj = _first_up(_bind(obj, args), args.scale_models)
            keda_owned = obj["kind"] == "Deployment" and obj["metadata"]["name"] in keda_targets
            KubeObject(obj, gpu_opts if keda_owned else k8s_opts)
        self.register_outputs({"objects": len(objects)})


# pulumi-kubernetes waits up to 10 minutes for a Deployment to become available; a GPU
# Deployment waits on a new node, the weights and a long start-up, so `up` does not wait on it
# (pulumi.com/skipAwait); its readiness is watched by the probes and the alerts instead.
SKIP_AWAIT = {"pulumi.com/skipAwait": "true"}
# KEDA keeps the target at this count while the annotation is present (keda-docs scaledobject-spec).
PAUSED = {"autoscaling.keda.sh/paused-replicas": "0"}


def _first_up(obj: Manifest, scale_models: bool) -> Manifest:
    """GPU Deployments start at 0 and stay there (KEDA paused) until `llmfleet:scaleModels` is true."""
    if obj["kind"] == "Deployment":
        obj["metadata"]["annotations"] = {**obj["metadata"].get("annotations", {}), **SKIP_AWAIT}
    elif obj["kind"] == "ScaledObject" and not scale_models:
        obj["metadata"]["annotations"] = {**obj["metadata"].get("annotations", {}), **PAUSED}
    return obj


def _bind(obj: Manifest, args: ServingArgs) -> Manifest:
    if obj["kind"] != "Deployment":
        return obj
    pod = obj["spec"]["template"]["spec"]
    for container in pod["containers"]:
        if container["name"] == "vllm":
            container["image"] = args.vllm_image
        else:
            container["image"] = args.agent_image
    init = pod["initContainers"][0]
    init["image"] = args.model_sync_image
    init["args"] = [args.model_bucket if a == "@MODEL_BUCKET@" else a for a in init["args"]]
    for var in init["env"]:
        if var["value"] == vllm.SIGNING_KEY_PLACEHOLDER:
            var["value"] = args.model_signing_key_arn
    return obj
