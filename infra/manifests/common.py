"""Names, labels and constants shared by every Kubernetes renderer."""

from __future__ import annotations

import hashlib
import re
from typing import Any

Manifest = dict[str, Any]

NAMESPACE = "llmfleet"
MONITORING_NAMESPACE = "monitoring"
PROMETHEUS_URL = "http://kube-prometheus-stack-prometheus.monitoring.svc:9090"
PROMETHEUS_RELEASE_LABEL = {"release": "kube-prometheus-stack"}

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
GPU_TAINT: dict[str, str] = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
# Only pods that tolerate this taint may land on the spot pool; only the spot model's pods do.
SPOT_TAINT_KEY = "llmfleet.io/spot-model"
MODEL_LABEL = "llmfleet.io/model"
# A canary pod's revision as a label value (`revision_slug`): `kubectl get pods -l` finds its pods.
REVISION_SLUG_LABEL = "llmfleet.io/revision-slug"
POOL_LABEL = "llmfleet.io/pool"
CAPACITY_TYPE = "karpenter.sh/capacity-type"

# The vLLM pod's hostPath cache: Karpenter's instanceStorePolicy RAID0 mounts the NVMe here.
MODEL_CACHE_HOST_PATH = "/mnt/k8s-disks/0/models"
MODEL_CACHE_MOUNT = "/models"

GATEWAY_PORT = 8080
ORCHESTRATOR_PORT = 8081
NODE_PORT = 8082  # the orchestrator's node-only port (WebSocket + health), see infra/manifests/netpol.py
ORCHESTRATOR_METRICS_PORT = 8083  # the orchestrator's metrics-only port (Prometheus), see netpol.py
GATEWAY_METRICS_PORT = 8084  # the gateway's `/metrics` port (Prometheus only), see netpol.py
VLLM_PORT = 8000
AGENT_HEALTH_PORT = 8090
# The engine's KV cache events inside the pod, on loopback only: vLLM connects its PUB socket to the
# agent's (which binds it) and binds its replay socket; the agent forwards them to the orchestrator.
KV_EVENTS_PORT = 5557
KV_REPLAY_PORT = 5558
KV_EVENTS_ENDPOINT = f"tcp://127.0.0.1:{KV_EVENTS_PORT}"
KV_REPLAY_ENDPOINT = f"tcp://127.0.0.1:{KV_REPLAY_PORT}"


def slug(model: str) -> str:
    """DNS-1123 label from a model name: `llama-3.1-8b-instruct` -> `llama-3-1-8b-instruct`."""
    value = re.sub(r"[^a-z0-9-]+", "-", model.lower()).strip("-")
    if not value or len(value) > 40:
        raise ValueError(f"model name {model!r} does not make a short DNS label")
    return value


_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_LABEL_VALUE_MAX = 63


def revision_slug(revision: str) -> str:
    """A revision as a label value (at most 63 of `[-A-Za-z0-9_.]`, alphanumeric at both ends): itself
    when it is one, else its valid characters cut short plus 8 hex of its SHA-256, so two revisions
    never share a slug (`2026/12/01` -> `2026-12-01-<hash>`, not `2026-12-01`'s)."""
    if revision and len(revision) <= _LABEL_VALUE_MAX and _LABEL_VALUE.fullmatch(revision):
        return revision
    digest = hashlib.sha256(revision.encode()).hexdigest()[:8]
    kept = re.sub(r"[^-A-Za-z0-9_.]+", "-", revision)[: _LABEL_VALUE_MAX - len(digest) - 1]
    kept = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", kept)
    return f"{kept}-{digest}" if kept else digest


def restricted_context(**first: Any) -> Manifest:
    """A container's `securityContext` with nothing to escalate to: no privilege escalation, a
    read-only root filesystem, every capability dropped (`first`: fields before those, e.g. runAsUser)."""
    return {
        **first,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def labels(component: str, **extra: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": component, "app.kubernetes.io/part-of": "llmfleet", **extra}


def meta(name: str, component: str, namespace: str = NAMESPACE, **extra: str) -> Manifest:
    return {"name": name, "namespace": namespace, "labels": labels(component, **extra)}
