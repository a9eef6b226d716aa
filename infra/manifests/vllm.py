"""One vLLM Deployment per model (two for the spot model, one more for a canary), its Service and PDBs.

A generate model's engine runs vLLM's default runner (`auto`: `generate` for a text-generation
architecture); an embed model's (`serving.task: embed`) runs `--runner pooling` and serves
`/v1/embeddings` only (`_embed_args`).

The pod's inputs and timing are `vllm_target.py`'s, its agent sidecar is `node_agent.py`'s.

Every number comes from the planner (`ModelPlan`): `--tensor-parallel-size` and the
`nvidia.com/gpu` limit are `gpus_per_replica`, `--max-num-seqs` and `--max-model-len` are the
planner's, so `llmfleet plan` and the cluster never disagree (docs/architecture.md D8).
"""

from __future__ import annotations

import json

from apps.core.sizing.pools import ON_DEMAND_POOL, SPOT_POOL
from infra.manifests import appenv
from infra.manifests.common import (
    AGENT_HEALTH_PORT,
    CAPACITY_TYPE,
    GPU_RESOURCE,
    GPU_TAINT,
    KV_EVENTS_ENDPOINT,
    KV_REPLAY_ENDPOINT,
    MODEL_CACHE_HOST_PATH,
    MODEL_CACHE_MOUNT,
    MODEL_LABEL,
    POOL_LABEL,
    REVISION_SLUG_LABEL,
    SPOT_TAINT_KEY,
    VLLM_PORT,
    Manifest,
    labels,
    meta,
    restricted_context,
    revision_slug,
    slug,
)
from infra.manifests.node_agent import agent_container
from infra.manifests.vllm_target import Capacity, Timing, VllmTarget, timing

GPU_MEMORY_UTILIZATION = 0.9
MODEL_SYNC_SERVICE_ACCOUNT = "model-sync"
# The model-signing KMS key's ARN, an output: the component binds it (infra/components/serving.py).
SIGNING_KEY_PLACEHOLDER = "@MODEL_SIGNING_KEY@"


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


CAPACITY_LABEL = "llmfleet.io/capacity"
# A canary's name suffix and its pods' value of the capacity label (they run on on-demand capacity).
# The stable Deployments' selectors name the capacity and a selector cannot change, so this value is
# what keeps a canary's pods out of their selectors and theirs out of the canary's.
CANARY = "canary"


def deployment_name(model: str, capacity: Capacity, canary: bool = False) -> str:
    """`vllm-<slug>` (on-demand), `-spot`, `-canary`: at most 52 characters (`slug` is at most 40)."""
    base = f"vllm-{slug(model)}"
    if canary:
        return f"{base}-{CANARY}"
    return base if capacity is Capacity.ON_DEMAND else f"{base}-spot"


def pod_labels(model: str, capacity: Capacity, canary: bool = False) -> dict[str, str]:
    """The Deployment's selector: no two Deployments of a model share one, none matches another's pods."""
    return labels("vllm", **{MODEL_LABEL: slug(model), CAPACITY_LABEL: CANARY if canary else capacity.value})


def _vllm_args(t: VllmTarget, tm: Timing) -> list[str]:
    p = t.plan
    if p.task == "embed":
        return _embed_args(t, tm)
    return [
        *_serve_args(t),
        "--block-size",
        str(t.block_size),
        "--shutdown-timeout",
        str(tm.shutdown_timeout_s),
        # The orchestrator passes the request's class as vLLM's `priority` (apps.core.sharing).
        "--scheduling-policy",
        "priority",
        # `usage.prompt_tokens_details.cached_tokens`: cached input is billed at its own price.
        "--enable-prompt-tokens-details",
        # The prefix cache's events, forwarded by the agent (apps/agent/kvforward.py).
        "--kv-events-config",
        json.dumps(
            {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": KV_EVENTS_ENDPOINT,
                "replay_endpoint": KV_REPLAY_ENDPOINT,
            },
            separators=(",", ":"),
        ),
    ]


def _serve_args(t: VllmTarget) -> list[str]:
    """What every engine is started with: the model revision, its name, and the planner's numbers."""
    p = t.plan
    return [
        "--model",
        f"{MODEL_CACHE_MOUNT}/{p.name}/{t.revision}",
        "--served-model-name",
        p.name,
        "--host",
        "0.0.0.0",
        "--port",
        str(VLLM_PORT),
        "--tensor-parallel-size",
        str(p.gpus_per_replica),
        "--max-model-len",
        str(p.max_model_len),
        "--max-num-seqs",
        str(p.max_num_seqs),
        "--gpu-memory-utilization",
        str(GPU_MEMORY_UTILIZATION),
    ]


def _embed_args(t: VllmTarget, tm: Timing) -> list[str]:
    """An embedding model (`serving.task: embed`): vLLM's pooling runner, which serves `/v1/embeddings`
    and no generation endpoint. vLLM's default `--convert auto` takes the architecture's own pooling
    model (an XLM-RoBERTa or BERT encoder has one) and adapts a decoder for embeddings otherwise. No
    generation-only flag: an encoder keeps no KV cache, so there is no block size, prefix cache or KV
    event to configure, and an embedding's usage has no prompt-token details. Pooling requests go
    through the same scheduler, so the orchestrator's priority classes apply."""
    return [
        *_serve_args(t),
        "--shutdown-timeout",
        str(tm.shutdown_timeout_s),
        "--scheduling-policy",
        "priority",
        "--runner",
        "pooling",
    ]


def _vllm_container(t: VllmTarget, tm: Timing) -> Manifest:
    p = t.plan
    gpus = str(p.gpus_per_replica)
    return {
        "name": "vllm",
        "image": t.vllm_image,
        "args": _vllm_args(t, tm),
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
        # The key each revision's signed manifest must verify with (bound at apply time).
        "env": [appenv.value(appenv.ModelSyncSettings, "model_signing_key", SIGNING_KEY_PLACEHOLDER)],
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        "volumeMounts": [{"name": "models", "mountPath": MODEL_CACHE_MOUNT}],
        # The hostPath cache is created root-owned by the kubelet; the copy needs to write there.
        "securityContext": restricted_context(runAsUser=0),
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
    if t.canary and capacity is not Capacity.ON_DEMAND:
        raise ValueError("a canary runs on on-demand capacity")
    tm = timing(t.plan)
    name = deployment_name(t.plan.name, capacity, t.canary)
    selector = pod_labels(t.plan.name, capacity, t.canary)
    # Not in the selector: a new canary revision rolls the canary's pods, it does not replace its Deployment.
    revision_label = {REVISION_SLUG_LABEL: revision_slug(t.revision)} if t.canary else {}
    spread_selector = {"matchLabels": {MODEL_LABEL: slug(t.plan.name)}}  # all of the model's pods
    spec: Manifest = {
        "selector": {"matchLabels": selector},
        "progressDeadlineSeconds": 1800,
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        "template": {
            "metadata": {
                "labels": {**selector, **revision_label},
                "annotations": {"llmfleet.io/revision": t.revision},
            },
            "spec": {
                "serviceAccountName": MODEL_SYNC_SERVICE_ACCOUNT,
                "terminationGracePeriodSeconds": tm.grace_period_s,
                "initContainers": [_model_sync_container(t)],
                "containers": [_vllm_container(t, tm), agent_container(t, tm, capacity)],
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
        "metadata": meta(name, "vllm", **{MODEL_LABEL: slug(t.plan.name), **revision_label}),
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


def pdb(model: str, capacity: Capacity, canary: bool = False) -> Manifest:
    # maxUnavailable, not minAvailable: a single-replica GPU Deployment must not block drains.
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta(deployment_name(model, capacity, canary), "vllm", **{MODEL_LABEL: slug(model)}),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": pod_labels(model, capacity, canary)}},
    }
