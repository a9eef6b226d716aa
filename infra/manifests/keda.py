"""KEDA ScaledObjects per model Deployment, thresholds from the planner (docs/architecture.md D8).

The signal (issue 18 section 1). The orchestrator never gives a node more than its
`max_num_seqs`, so a model's unserved demand waits in the orchestrator's per-model queue
(`llmfleet_orchestrator_queue_depth{model}`, one series per orchestrator replica) and
`vllm:num_requests_waiting` stays near 0. Every ScaledObject therefore scales on the model's
*demand*: streams in service (`vllm:num_requests_running`) plus vLLM's own waiting requests plus
the orchestrator queue summed over orchestrator replicas, against a target of
`streams_per_replica / (1 + headroom)` streams per replica, so a constant load settles at the
replica count `llmfleet plan` prints. KV-cache use is a second trigger (long prompts fill the
cache before the stream count says so), the office-hours cron a third.

An embedding model (`serving.task: embed`, vLLM's pooling runner) scales on the same demand, in
inputs in flight: vLLM 0.32 exports `vllm:num_requests_running` and `vllm:num_requests_waiting` for
the pooling runner too, one per input being embedded, and its target (`streams_per_replica /
(1 + headroom)`) is where a replica embeds its planned prompt tokens per second. It has no KV-cache
trigger: an encoder keeps no KV cache, so `vllm:kv_cache_usage_perc` stays 0.

Anti-flap. The demand query is a `max_over_time(...[2m:15s])` subquery: a request that ages out of
the queue at the 30 s limit still reads as demand for two minutes, so activation from zero cannot
drop back before a replica exists. `cooldownPeriod` (KEDA's 1 -> 0) and the HPA's scale-down
stabilisation window are never shorter than the model's start-up budget (node launch plus the
vLLM startup-probe budget), so a scale-down cannot undo a scale-up that has not become ready.
The spot burst Deployment activates only on demand beyond its on-demand floor's target that
exceeds what one replica clears within the queue-wait SLO, never on a single waiting request.

A canary (the model's second live revision, `ModelSpec.canary`) serves the same model name, so
`model_name` cannot tell its engines' series from the stable ones': the target pod's name can
(`pod`, the label the Prometheus operator puts on every scraped series, is `<Deployment>-<hash>-<id>`).
The canary scales on its own pods' streams and KV cache only, never on the model's orchestrator
queue (the orchestrator gives it its share of the traffic; a queue shared by both revisions would
scale it to its maximum), and keeps at least one replica; the stable ScaledObjects leave the
canary's pods out of their vLLM terms and keep the orchestrator's.

Upstream semantics this relies on (and `apps/simulate` reproduces):
- KEDA, https://keda.sh/docs/2.21/concepts/scaling-deployments/ ("Activating and Scaling
  thresholds"; `cooldownPeriod` applies to scaling to zero only) and
  https://keda.sh/docs/2.21/reference/scaledobject-spec/ (pollingInterval, cooldownPeriod,
  `advanced.horizontalPodAutoscalerConfig`); activation is `value > activationThreshold`.
- HPA, https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/#algorithm-details:
  `desiredReplicas = ceil(currentReplicas x currentMetricValue / desiredMetricValue)`, which for an
  `AverageValue` external metric is `ceil(metric / target)`, skipped within the 0.1 tolerance;
  behaviour (stabilisation windows, policies) per KEP-853.

Every Prometheus query aggregates with `sum(...)` so it returns one series (KEDA errors on
more); each term is `or vector(0)` so a missing series (no pod yet) reads as 0 instead of
making the whole sum empty. Trigger metadata values are strings (the CRD's `map[string]string`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from apps.core.sizing.plan import ModelPlan
from infra.config import OfficeHours
from infra.manifests.common import PROMETHEUS_URL, Manifest, meta, slug
from infra.manifests.vllm_target import timing

# Scale out when the average KV-cache use per replica passes this (alert fires at 0.9).
KV_CACHE_TARGET = 0.8
# Scale-down never faster than this, and never faster than the model's start-up budget.
MIN_SCALE_DOWN_STABILIZATION_S = 600
POLLING_INTERVAL_S = 15
# Allowance for Karpenter to launch and join a GPU node, on top of the pod's startup-probe budget.
NODE_LAUNCH_BUDGET_S = 300
# Longer than the orchestrator's 30 s queue limit: aged-out requests still count as demand.
DEMAND_WINDOW = "2m"
SCRAPE_STEP = "15s"
ORCHESTRATOR_QUEUE_METRIC = "llmfleet_orchestrator_queue_depth"
# 1 per orchestrator replica that told a request the model is loading (apps/orchestrator/coldstart.py):
# such a request is answered at once instead of waiting in the queue, so this is its demand.
ORCHESTRATOR_COLD_START_METRIC = "llmfleet_orchestrator_cold_start_pending"
SCALE_UP_PODS_PER_MINUTE = 2
SCALE_DOWN_PODS_PER_PERIOD = 1
SCALE_DOWN_PERIOD_S = 300


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
    headroom: float = 0.0  # the spec's serving.headroom: the target leaves this share free
    # A `pod_matcher(...)` on the vLLM series ("": all of the model's) and whether the orchestrator's
    # per-model terms count (not for a canary: see the module docstring).
    pods: str = ""
    orchestrator_terms: bool = True


def pod_matcher(deployment: str, own: bool = True) -> str:
    """The PromQL matcher for the pods of `deployment` (`own`) or every other pod: `pod` is
    `<Deployment>-<ReplicaSet hash>-<suffix>` (PromQL regexes are anchored; neither part has a `-`)."""
    return f'pod{"=~" if own else "!~"}"{deployment}-[a-z0-9]+-[a-z0-9]+"'


def waiting_threshold(plan: ModelPlan, queue_wait_p95_s: float) -> int:
    """Waiting requests one replica clears within the queue-wait SLO."""
    return max(1, math.floor(plan.queue.requests_per_s_per_replica * queue_wait_p95_s))


def streams_target(plan: ModelPlan, headroom: float) -> float:
    """Streams per replica the HPA aims at: the plan's `ceil(peak x (1 + headroom) / target)` inverted."""
    return round(plan.streams_target / (1 + headroom), 2)


def startup_budget_s(plan: ModelPlan) -> int:
    """Node launch plus the vLLM startup-probe budget (weights from NVMe, CUDA graphs)."""
    return NODE_LAUNCH_BUDGET_S + 10 * timing(plan).startup_failure_threshold


def scale_down_window_s(plan: ModelPlan) -> int:
    return max(MIN_SCALE_DOWN_STABILIZATION_S, startup_budget_s(plan))


def _or_zero(query: str) -> str:
    return f"({query} or vector(0))"


def _vllm_selector(model: str, pods: str) -> str:
    return f'{{model_name="{model}"{"," + pods if pods else ""}}}'


def demand_query(
    model: str, base_replicas: int = 0, per_replica: float = 0.0, pods: str = "", orchestrator: bool = True
) -> str:
    """Streams in service + vLLM waiting + orchestrator queue + cold starts told to wait (all
    replicas), max over 2 minutes. `pods`/`orchestrator`: see `ScalingTarget`."""
    vllm_sel = _vllm_selector(model, pods)
    terms = [
        _or_zero(f"sum(vllm:num_requests_running{vllm_sel})"),
        _or_zero(f"sum(vllm:num_requests_waiting{vllm_sel})"),
    ]
    if orchestrator:
        terms += [
            _or_zero(f'sum({ORCHESTRATOR_QUEUE_METRIC}{{model="{model}"}})'),
            _or_zero(f'sum({ORCHESTRATOR_COLD_START_METRIC}{{model="{model}"}})'),
        ]
    query = f"max_over_time(({' + '.join(terms)})[{DEMAND_WINDOW}:{SCRAPE_STEP}])"
    if base_replicas == 0:
        return query
    return f"clamp_min({query} - {base_replicas * per_replica:g}, 0)"


def kv_query(model: str, base_replicas: int = 0, pods: str = "") -> str:
    query = f"sum(vllm:kv_cache_usage_perc{_vllm_selector(model, pods)})"
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


def _activation(t: ScalingTarget) -> str | None:
    if t.min_replicas > 0:
        return None  # KEDA ignores activation above zero
    if t.base_replicas > 0:
        # A burst pool wakes on more excess demand than one replica clears in the SLO, not on one request.
        return str(waiting_threshold(t.plan, t.queue_wait_p95_s))
    return "0"


def triggers(t: ScalingTarget) -> list[Manifest]:
    model = t.plan.name
    per_replica = streams_target(t.plan, t.headroom)
    result = [
        _prometheus(
            "demand",
            demand_query(model, t.base_replicas, per_replica, t.pods, t.orchestrator_terms),
            f"{per_replica:g}",
            activation=_activation(t),
        )
    ]
    if t.plan.task != "embed":  # an embedding engine keeps no KV cache (module docstring)
        # sum(...) with AverageValue = average per replica, so the target reads as a fraction.
        result.append(
            _prometheus("vllm-kv-cache", kv_query(model, t.base_replicas, t.pods), str(KV_CACHE_TARGET))
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
    window = scale_down_window_s(t.plan)
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": meta(t.deployment, "vllm", **{"llmfleet.io/model": slug(t.plan.name)}),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": t.deployment},
            "minReplicaCount": t.min_replicas,
            "maxReplicaCount": t.max_replicas,
            "pollingInterval": POLLING_INTERVAL_S,
            "cooldownPeriod": window,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {
                        "scaleDown": {
                            "stabilizationWindowSeconds": window,
                            "policies": [
                                {
                                    "type": "Pods",
                                    "value": SCALE_DOWN_PODS_PER_PERIOD,
                                    "periodSeconds": SCALE_DOWN_PERIOD_S,
                                }
                            ],
                        },
                        "scaleUp": {
                            "stabilizationWindowSeconds": 0,
                            "policies": [
                                {"type": "Pods", "value": SCALE_UP_PODS_PER_MINUTE, "periodSeconds": 60}
                            ],
                        },
                    }
                }
            },
            "triggers": triggers(t),
        },
    }
