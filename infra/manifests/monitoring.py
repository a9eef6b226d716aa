"""ServiceMonitors for every component and the PrometheusRule with the brief's SLI alerts."""

from __future__ import annotations

from infra.manifests.common import (
    MONITORING_NAMESPACE,
    NAMESPACE,
    PROMETHEUS_RELEASE_LABEL,
    Manifest,
    labels,
    slug,
)
from infra.manifests.keda import ORCHESTRATOR_QUEUE_METRIC


def service_monitor(
    name: str, namespace: str, selector: dict[str, str], port: str, path: str = "/metrics"
) -> Manifest:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {
            "name": name,
            "namespace": MONITORING_NAMESPACE,
            "labels": {**labels(name), **PROMETHEUS_RELEASE_LABEL},
        },
        "spec": {
            "namespaceSelector": {"matchNames": [namespace]},
            "selector": {"matchLabels": selector},
            "endpoints": [{"port": port, "path": path, "interval": "15s"}],
        },
    }


def service_monitors() -> list[Manifest]:
    return [
        service_monitor("gateway", NAMESPACE, labels("gateway"), "http"),
        service_monitor("orchestrator", NAMESPACE, labels("orchestrator"), "http"),
        service_monitor("vllm", NAMESPACE, {"app.kubernetes.io/name": "vllm"}, "http"),
        service_monitor("agent", NAMESPACE, {"app.kubernetes.io/name": "vllm"}, "agent"),
        service_monitor(
            "dcgm-exporter", MONITORING_NAMESPACE, {"app.kubernetes.io/name": "dcgm-exporter"}, "metrics"
        ),
        service_monitor("keda", "keda", {"app.kubernetes.io/name": "keda-operator"}, "metrics"),
        service_monitor("karpenter", "kube-system", {"app.kubernetes.io/name": "karpenter"}, "http-metrics"),
    ]


def _alert(name: str, expr: str, for_: str, severity: str, summary: str) -> Manifest:
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity},
        "annotations": {"summary": summary},
    }


def prometheus_rule(models_at_zero: list[str]) -> Manifest:
    rules = [
        _alert(
            "LlmfleetKvCacheNearlyFull",
            "max by (model_name, pod) (vllm:kv_cache_usage_perc) > 0.9",
            "5m",
            "warning",
            "KV cache above 90 % for 5 minutes: preemptions and TTFT spikes follow",
        ),
        _alert(
            "LlmfleetGpuIdle",
            "avg by (Hostname, gpu) (DCGM_FI_PROF_GR_ENGINE_ACTIVE) < 0.2",
            "1h",
            "info",
            "GPU graphics engine active below 20 % for an hour",
        ),
        _alert(
            "LlmfleetGatewayLiveTasksGrowing",
            # Tasks growing for hours while streams do not: a relay leaks its tasks on disconnect.
            "deriv(llmfleet_gateway_asyncio_tasks[1h]) > 0"
            " and llmfleet_gateway_asyncio_tasks > 3 * llmfleet_gateway_active_streams + 100",
            "2h",
            "warning",
            "gateway live tasks grow steadily: a stream is not released on disconnect",
        ),
    ]
    for model in models_at_zero:
        idle = _alert(
            "LlmfleetScaleToZeroModelIdle",
            f'sum(kube_deployment_status_replicas{{namespace="{NAMESPACE}",deployment="vllm-{slug(model)}"}}) > 0'
            f' and sum({ORCHESTRATOR_QUEUE_METRIC}{{model="{model}"}}) == 0'
            f' and sum(vllm:num_requests_running{{model_name="{model}"}}) == 0',
            "2h",
            "info",
            f"{model} has run replicas with an empty queue for 2 hours",
        )
        idle["labels"]["model"] = model
        rules.append(idle)
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "llmfleet-slis",
            "namespace": MONITORING_NAMESPACE,
            "labels": {**labels("llmfleet"), **PROMETHEUS_RELEASE_LABEL},
        },
        "spec": {"groups": [{"name": "llmfleet.slis", "rules": rules}]},
    }
