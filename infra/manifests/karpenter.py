"""Karpenter objects: one EC2NodeClass (AL2023 alias) and the GPU NodePools, from the stack spec.

g6e comes with 1, 4 or 8 L40S GPUs per node and no 2-GPU size: a `--tensor-parallel-size 2`
replica lands on a 4-GPU node (g6e.12xlarge/24xlarge) and two such replicas pack onto it;
a 4-GPU 70B replica fits one g6e.12xlarge (Karpenter's generated instance-types table,
`website/content/en/docs/reference/instance-types.md`).
"""

from __future__ import annotations

from dataclasses import dataclass

from apps.core.sizing.plan import plan_fleet
from apps.core.sizing.pools import ON_DEMAND_POOL, SPOT_POOL, check_pool_caps, pool_demand
from apps.core.spec import StackSpec
from infra.manifests.common import (
    CAPACITY_TYPE,
    GPU_PRESENT_LABEL,
    GPU_RESOURCE,
    GPU_TAINT,
    POOL_LABEL,
    SPOT_TAINT_KEY,
    Manifest,
    labels,
)

NODE_CLASS_NAME = "gpu-al2023"


@dataclass(frozen=True)
class GpuPoolSpec:
    instance_family: str
    gpus_per_instance: tuple[int, ...]
    gpu_limits: dict[str, int]  # pool -> nvidia.com/gpu limit (apps.core.sizing.pools)
    spot_model: str | None  # the one model admitted to the spot pool (None: no spot pool)


def gpu_pool_spec(spec: StackSpec) -> GpuPoolSpec:
    gpu_types = {m.serving.gpu_type for m in spec.models.values()}
    if len(gpu_types) != 1:
        raise ValueError(f"the GPU NodePools serve one GPU type, the spec uses {sorted(gpu_types)}")
    gpu = spec.gpu_types[gpu_types.pop()]
    spot = [name for name, m in spec.models.items() if m.serving.spot]
    if len(spot) > 1:
        raise ValueError(f"only one model may use the spot pool, the spec marks {spot}")
    demands = pool_demand(spec, plan_fleet(spec))
    check_pool_caps(demands)
    limits = {d.pool: d.gpus for d in demands}
    return GpuPoolSpec(gpu.instance_family, gpu.gpus_per_instance, limits, spot[0] if spot else None)


def ec2_node_class(*, cluster_name: str, node_role_name: str, ami_alias: str) -> Manifest:
    # One class for all GPU pools: with an `al2023@` alias Karpenter resolves the NVIDIA AMI
    # variant for GPU instance types itself.
    return {
        "apiVersion": "karpenter.k8s.aws/v1",
        "kind": "EC2NodeClass",
        "metadata": {"name": NODE_CLASS_NAME, "labels": labels("karpenter")},
        "spec": {
            "amiSelectorTerms": [{"alias": ami_alias}],
            "role": node_role_name,
            "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": cluster_name}}],
            "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": cluster_name}}],
            "instanceStorePolicy": "RAID0",
            "blockDeviceMappings": [
                {
                    "deviceName": "/dev/xvda",
                    "rootVolume": True,
                    "ebs": {"volumeSize": "100Gi", "volumeType": "gp3", "encrypted": True},
                }
            ],
            "metadataOptions": {
                "httpEndpoint": "enabled",
                "httpProtocolIPv6": "disabled",
                "httpPutResponseHopLimit": 1,
                "httpTokens": "required",
            },
            "tags": {"llmfleet.io/cluster": cluster_name},
        },
    }


def _pool(name: str, spec: GpuPoolSpec, capacity: str, extra_taints: list[dict[str, str]]) -> Manifest:
    gpu_counts = [str(n) for n in sorted(spec.gpus_per_instance)]
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": name, "labels": labels("karpenter")},
        "spec": {
            "template": {
                # The device plugin and DCGM exporter select this label (nvidia-device-plugin chart
                # values.yaml; nothing else sets it without NFD/GFD), so every GPU node carries it.
                "metadata": {"labels": {POOL_LABEL: name, GPU_PRESENT_LABEL: "true"}},
                "spec": {
                    "nodeClassRef": {
                        "group": "karpenter.k8s.aws",
                        "kind": "EC2NodeClass",
                        "name": NODE_CLASS_NAME,
                    },
                    "requirements": [
                        {
                            "key": "karpenter.k8s.aws/instance-family",
                            "operator": "In",
                            "values": [spec.instance_family],
                        },
                        {
                            "key": "karpenter.k8s.aws/instance-gpu-count",
                            "operator": "In",
                            "values": gpu_counts,
                        },
                        {"key": CAPACITY_TYPE, "operator": "In", "values": [capacity]},
                        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
                    ],
                    "taints": [dict(GPU_TAINT), *extra_taints],
                    "expireAfter": "720h",
                    # Lets in-flight streams finish when a node is drained (vLLM grace is shorter).
                    "terminationGracePeriod": "30m",
                },
            },
            # WhenEmpty: only empty nodes go after consolidateAfter (the brief); WhenEmptyOrUnderutilized
            # would evict busy vLLM replicas to repack them (Karpenter disruption docs).
            "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "10m"},
            # The replica maxima's GPUs, counted per node (apps.core.sizing.pools): a runaway
            # scale-up cannot buy more, and the maxima always fit.
            "limits": {GPU_RESOURCE: spec.gpu_limits[name]},
        },
    }


def node_pools(spec: GpuPoolSpec) -> list[Manifest]:
    pools = [_pool(ON_DEMAND_POOL, spec, "on-demand", [])]
    if spec.spot_model is not None:
        spot_taint = {"key": SPOT_TAINT_KEY, "value": spec.spot_model, "effect": "NoSchedule"}
        pools.append(_pool(SPOT_POOL, spec, "spot", [spot_taint]))
    return pools
