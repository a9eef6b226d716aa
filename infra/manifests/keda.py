"""KEDA ScaledObjects per model Deployment, thresholds from the planner.

Every Prometheus query aggregates with `sum(...)` so it returns one series (KEDA errors on
more). Trigger metadata values are strings (the CRD's `map[string]string`). A model that
may sit at zero replicas activates on the orchestrator's per-model queue metric, because no
`vllm:*` series exists while no vLLM pod runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from apps.core.sizing.plan import ModelPlan
from infra.config import OfficeHours
from infra.manifests.common import PROMETHEUS_URL, Manifest, meta, slug

# Scale out when the average KV-cache use per replica passes this (alert fires at 0.9).
KV_CACHE_TARGET = 0.8
SCALE_DOWN_STABILIZATION_S = 600
ORCHESTRATOR_QUEUE_METRIC = "llmfleet_orchestrator_queue_depth"


@dataclass(frozen=True)
class ScalingTarget:
    deployment: str
    plan: ModelPlan
    min_replicas: int
    max_replicas: int
    queue_wait_p95_s: float
    office_hours: OfficeHours | None = None
    office_hours_replicas: int = 0
    # Replicas of the same model outside this ScaledObject (the on-demand floor under a spot
    # burst Deployment): their share of the load is subtracted so the burst adds only the excess.
    base_replicas: int = 0


def waiting_threshold(plan: ModelPlan, queue_wait_p95_s: float) -> int:
    """Waiting requests one replica clears within the queue-wait SLO: beyond that, add one."""
    return max(1, math.floor(plan.queue.requests_per_s_per_replica * queue_wait_p95_s))


def kv_query(model: str, base_replicas: int = 0) -> str:
    query = f'sum(vllm:kv_cache_usage_perc{{model_name="{model}"}})'
    if base_replicas == 0:
        return query
    # Without the offset a burst Deployment at zero would activate on the floor's normal KV use.
    return f"clamp_min({query} - {base_replicas * KV_CACHE_TARGET:g}, 0)"


def _prometheus(name: str, query: str, threshold: str, activation: str | None = None) -> Manifest:
    metadata = {
        "serverAddress": PROMETHEUS_URL,
        "query": query,
        "threshold": threshold,
        "ignoreNullValues": "true",
    }
    if activation is not None:
        metadata["activationThreshold"] = activation
    return {"type": "prometheus", "name": name, "metricType": "AverageValue", "metadata": metadata}


def triggers(t: ScalingTarget) -> list[Manifest]:
    model = t.plan.name
    selector = f'{{model_name="{model}"}}'
    result = [
        _prometheus(
            "vllm-waiting",
            f"sum(vllm:num_requests_waiting{selector})",
            str(waiting_threshold(t.plan, t.queue_wait_p95_s)),
        ),
        # sum(...) with AverageValue = average per replica, so the target reads as a fraction.
        _prometheus("vllm-kv-cache", kv_query(model, t.base_replicas), str(KV_CACHE_TARGET)),
    ]
    if t.min_replicas == 0:
        result.append(
            _prometheus(
                "orchestrator-queue",
                f'sum({ORCHESTRATOR_QUEUE_METRIC}{{model="{model}"}})',
                str(waiting_threshold(t.plan, t.queue_wait_p95_s)),
                activation="0",
            )
        )
    if t.office_hours is not None and t.office_hours_replicas > 0:
        result.append(
            {
                "type": "cron",
                "name": "office-hours",
                "metadata": {
                    "timezone": t.office_hours.timezone,
                    "start": t.office_hours.start,
                    "end": t.office_hours.end,
                    "desiredReplicas": str(t.office_hours_replicas),
                },
            }
        )
    return result


def scaled_object(t: ScalingTarget) -> Manifest:
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": meta(t.deployment, "vllm", **{"llmfleet.io/model": slug(t.plan.name)}),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": t.deployment},
            "minReplicaCount": t.min_replicas,
            "maxReplicaCount": t.max_replicas,
            "pollingInterval": 15,
            "cooldownPeriod": SCALE_DOWN_STABILIZATION_S,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {
                        "scaleDown": {
                            "stabilizationWindowSeconds": SCALE_DOWN_STABILIZATION_S,
                            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 300}],
                        },
                        "scaleUp": {
                            "stabilizationWindowSeconds": 0,
                            "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}],
                        },
                    }
                }
            },
            "triggers": triggers(t),
        },
    }
