"""One vLLM Deployment per model (two for the spot model), its Service and PDBs.

Every number comes from the planner (`ModelPlan`): `--tensor-parallel-size` and the
`nvidia.com/gpu` limit are `gpus_per_replica`, `--max-num-seqs` and `--max-model-len` are the
planner's, so `llmfleet plan` and the cluster never disagree (ARCHITECTURE D8).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from apps.core.sizing.plan import ModelPlan
from apps.core.sizing.pools import ON_DEMAND_POOL, SPOT_POOL
from infra.manifests.common import (
    AGENT_HEALTH_PORT,
    CAPACITY_TYPE,
    GPU_RESOURCE,
    GPU_TAINT,
    MODEL_CACHE_HOST_PATH,
    MODEL_CACHE_MOUNT,
    MODEL_LABEL,
    NAMESPACE,
    NODE_PORT,
    POOL_LABEL,
    SPOT_TAINT_KEY,
    VLLM_PORT,
    Manifest,
    labels,
    meta,
    slug,
)

GPU_MEMORY_UTILIZATION = 0.9
NODE_TOKEN_SECRET = "llmfleet-cloud-node-token"
# Every vLLM pod's agent shares the Secret's token as members of this node pool: pod names are
# not known in advance, so the migrate Job registers the pool and the agent's node id is
# `<pool>/<pod name>` (apps.core.nodes.ids).
NODE_POOL = "eks"
MODEL_SYNC_SERVICE_ACCOUNT = "model-sync"


class Capacity(enum.Enum):
    ON_DEMAND = "on-demand"
    SPOT = "spot"  # prefers the spot pool, falls back to on-demand when spot is short


@dataclass(frozen=True)
class VllmTarget:
    """What the renderer needs besides the plan: images, bucket, revision and timing inputs."""

    plan: ModelPlan
    revision: str
    vllm_image: str
    agent_image: str
    model_bucket: str
    block_size: int = 16


@dataclass(frozen=True)
class Timing:
    stream_budget_s: int  # the longest stream we promise to finish on shutdown
    shutdown_timeout_s: int
    grace_period_s: int
    startup_failure_threshold: int


def timing(plan: ModelPlan) -> Timing:
    # The longest stream vLLM can produce: a full --max-model-len answer at the planned per-stream rate.
    # Idle pods do not wait for it (the preStop hooks end as soon as the agent has drained).
    stream = math.ceil(plan.max_model_len / plan.tokens_per_s_per_stream)
    shutdown = stream + 30
    # Agent drain (<= stream) then vLLM's own shutdown timeout, plus slack for SIGKILL.
    grace = stream + shutdown + 30
    # Weight loading from local NVMe plus CUDA graph capture; vLLM refuses connections meanwhile.
    startup_s = 300 + 10 * math.ceil(plan.weights_gib)
    return Timing(stream, shutdown, grace, math.ceil(startup_s / 10))


def wait_for_agent_exit(budget_s: int, port: int = AGENT_HEALTH_PORT) -> str:
    """Python source of the vLLM preStop hook: return once the agent's port refuses, or at the budget."""
    return (
        "import socket, time\n"
        f"deadline = time.monotonic() + {budget_s}\n"
        "while time.monotonic() < deadline:\n"
        "    try:\n"
        f"        socket.create_connection(('127.0.0.1', {port}), 1).close()\n"
        "    except OSError:\n"
        "        break\n"
        "    time.sleep(1)\n"
    )


def deployment_name(model: str, capacity: Capacity) -> str:
    base = f"vllm-{slug(model)}"
    return base if capacity is Capacity.ON_DEMAND else f"{base}-spot"


def pod_labels(model: str, capacity: Capacity) -> dict[str, str]:
    return labels("vllm", **{MODEL_LABEL: slug(model), "llmfleet.io/capacity": capacity.value})


def _vllm_container(t: VllmTarget, tm: Timing) -> Manifest:
    p = t.plan
    gpus = str(p.gpus_per_replica)
    return {
        "name": "vllm",
        "image": t.vllm_image,
        "args": [
            "--model",
            f"{MODEL_CACHE_MOUNT}/{p.name}/{t.revision}",
            "--served-model-name",
            p.name,
            "--host",
            "0.0.0.0",
            "--port",
            str(VLLM_PORT),
            "--tensor-parallel-size",
            gpus,
            "--max-model-len",
            str(p.max_model_len),
            "--max-num-seqs",
            str(p.max_num_seqs),
            "--gpu-memory-utilization",
            str(GPU_MEMORY_UTILIZATION),
            "--block-size",
            str(t.block_size),
            "--shutdown-timeout",
            str(tm.shutdown_timeout_s),
            # The orchestrator passes the request's class as vLLM's `priority` (apps.core.sharing).
            "--scheduling-policy",
            "priority",
        ],
        "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}],
        "ports": [{"name": "http", "containerPort": VLLM_PORT}],
        "resources": {
            "requests": {
                "cpu": str(3 * p.gpus_per_replica),
                "memory": f"{24 * p.gpus_per_replica}Gi",
                GPU_RESOURCE: gpus,
            },
            "limits": {"memory": f"{28 * p.gpus_per_replica}Gi", GPU_RESOURCE: gpus},
        },
        "startupProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": 10,
            "failureThreshold": tm.startup_failure_threshold,
        },
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": 5,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        # Keep serving until the agent has drained (its port closes) or the stream budget is spent;
        # SIGTERM then starts vLLM's own --shutdown-timeout.
        "lifecycle": {
            "preStop": {"exec": {"command": ["python3", "-c", wait_for_agent_exit(tm.stream_budget_s)]}}
        },
        "volumeMounts": [
            {"name": "models", "mountPath": MODEL_CACHE_MOUNT, "readOnly": True},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
        "securityContext": {"allowPrivilegeEscalation": False},
    }


def agent_node_id(pool: str = NODE_POOL) -> str:
    """The sidecar's node id: a member of the pool the migrate Job registers."""
    return f"{pool}/$(POD_NAME)"


# EC2 announces a Spot reclaim two minutes ahead; Karpenter (its interruption queue) drains the node
# at once. A spot pod's agent drains within what is left of the notice minus the time another node
# needs to take over the streams handed off at the deadline (resumed there: docs/control-plane.md).
SPOT_NOTICE_S = 120
SPOT_HANDOFF_S = 20


def agent_drain_s(tm: Timing, capacity: Capacity) -> int:
    """The agent's drain bound: the stream budget, within the Spot notice on the spot pool."""
    if capacity is Capacity.ON_DEMAND:
        return tm.stream_budget_s
    return min(tm.stream_budget_s, SPOT_NOTICE_S - SPOT_HANDOFF_S)


def _agent_container(t: VllmTarget, tm: Timing, capacity: Capacity) -> Manifest:
    p = t.plan
    return {
        "name": "agent",
        "image": t.agent_image,
        "args": [
            "agent",
            "--orchestrator-url",
            f"ws://orchestrator.{NAMESPACE}.svc:{NODE_PORT}/v1/nodes/connect",
            "--node-id",
            agent_node_id(),
            "--engine-url",
            f"http://127.0.0.1:{VLLM_PORT}",
            "--model",
            p.name,
            "--max-num-seqs",
            str(p.max_num_seqs),
            "--max-model-len",
            str(p.max_model_len),
            "--gpus",
            str(p.gpus_per_replica),
            "--location",
            "cloud",
            "--drain-timeout",
            str(agent_drain_s(tm, capacity)),
            "--journal",
            "/var/lib/llmfleet/journal",
            "--health-host",
            "0.0.0.0",  # the kubelet probes the pod IP
            "--health-port",
            str(AGENT_HEALTH_PORT),
        ],
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {
                "name": "LLMFLEET_NODE_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": NODE_TOKEN_SECRET, "key": "token"}},
            },
        ],
        "ports": [{"name": "agent", "containerPort": AGENT_HEALTH_PORT}],
        # /readyz follows registration and drain state; /livez stays 200 while draining.
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "agent"}, "periodSeconds": 5},
        "livenessProbe": {
            "httpGet": {"path": "/livez", "port": "agent"},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
        # The agent drains on SIGTERM (no new assignments, in-flight streams finish); the hook
        # blocks until it has, so vLLM is not stopped under running streams.
        "lifecycle": {
            "preStop": {
                "exec": {
                    "command": [
                        "/bin/sh",
                        "-c",
                        "kill -TERM 1; while kill -0 1 2>/dev/null; do sleep 1; done",
                    ]
                }
            }
        },
        "volumeMounts": [{"name": "journal", "mountPath": "/var/lib/llmfleet"}],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
        },
    }


def _model_sync_container(t: VllmTarget) -> Manifest:
    return {
        "name": "model-sync",
        "image": t.agent_image,
        "args": [
            "model-sync",
            "--bucket",
            t.model_bucket,
            "--model",
            t.plan.name,
            "--revision",
            t.revision,
            "--dest",
            MODEL_CACHE_MOUNT,
        ],
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        "volumeMounts": [{"name": "models", "mountPath": MODEL_CACHE_MOUNT}],
        # The hostPath cache is created root-owned by the kubelet; the copy needs to write there.
        "securityContext": {
            "runAsUser": 0,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }


def _scheduling(t: VllmTarget, capacity: Capacity) -> Manifest:
    tolerations: list[Manifest] = [
        {
            "key": GPU_TAINT["key"],
            "operator": "Equal",
            "value": GPU_TAINT["value"],
            "effect": GPU_TAINT["effect"],
        }
    ]
    if capacity is Capacity.ON_DEMAND:
        affinity: Manifest = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": POOL_LABEL, "operator": "In", "values": [ON_DEMAND_POOL]},
                                {"key": CAPACITY_TYPE, "operator": "In", "values": ["on-demand"]},
                            ]
                        }
                    ]
                }
            }
        }
    else:
        tolerations.append(
            {"key": SPOT_TAINT_KEY, "operator": "Equal", "value": t.plan.name, "effect": "NoSchedule"}
        )
        affinity = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": POOL_LABEL, "operator": "In", "values": [SPOT_POOL, ON_DEMAND_POOL]}
                            ]
                        }
                    ]
                },
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "preference": {
                            "matchExpressions": [{"key": CAPACITY_TYPE, "operator": "In", "values": ["spot"]}]
                        },
                    }
                ],
            }
        }
    return {"tolerations": tolerations, "affinity": affinity}


def deployment(t: VllmTarget, capacity: Capacity, replicas: int | None) -> Manifest:
    """`replicas=None` leaves the count to KEDA, so a `pulumi up` never fights the autoscaler."""
    tm = timing(t.plan)
    name = deployment_name(t.plan.name, capacity)
    selector = pod_labels(t.plan.name, capacity)
    spread_selector = {"matchLabels": {MODEL_LABEL: slug(t.plan.name)}}
    spec: Manifest = {
        "selector": {"matchLabels": selector},
        "progressDeadlineSeconds": 1800,
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        "template": {
            "metadata": {
                "labels": selector,
                "annotations": {"llmfleet.io/revision": t.revision},
            },
            "spec": {
                "serviceAccountName": MODEL_SYNC_SERVICE_ACCOUNT,
                "terminationGracePeriodSeconds": tm.grace_period_s,
                "initContainers": [_model_sync_container(t)],
                "containers": [_vllm_container(t, tm), _agent_container(t, tm, capacity)],
                **_scheduling(t, capacity),
                "topologySpreadConstraints": [
                    {
                        "maxSkew": 1,
                        "topologyKey": key,
                        "whenUnsatisfiable": "ScheduleAnyway",
                        "labelSelector": spread_selector,
                    }
                    for key in ("topology.kubernetes.io/zone", "kubernetes.io/hostname")
                ],
                "volumes": [
                    {
                        "name": "models",
                        "hostPath": {"path": MODEL_CACHE_HOST_PATH, "type": "DirectoryOrCreate"},
                    },
                    {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
                    {"name": "journal", "emptyDir": {"sizeLimit": "1Gi"}},
                ],
            },
        },
    }
    if replicas is not None:
        spec["replicas"] = replicas
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(name, "vllm", **{MODEL_LABEL: slug(t.plan.name)}),
        "spec": spec,
    }


def service(model: str) -> Manifest:
    """Scrape target for vLLM and agent metrics (traffic itself goes through the agent's socket)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(f"vllm-{slug(model)}", "vllm", **{MODEL_LABEL: slug(model)}),
        "spec": {
            "selector": {MODEL_LABEL: slug(model), "app.kubernetes.io/name": "vllm"},
            "ports": [
                {"name": "http", "port": VLLM_PORT, "targetPort": "http"},
                {"name": "agent", "port": AGENT_HEALTH_PORT, "targetPort": "agent"},
            ],
        },
    }


def pdb(model: str, capacity: Capacity) -> Manifest:
    # maxUnavailable, not minAvailable: a single-replica GPU Deployment must not block drains.
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta(deployment_name(model, capacity), "vllm", **{MODEL_LABEL: slug(model)}),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": pod_labels(model, capacity)}},
    }
