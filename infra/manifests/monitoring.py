"""ServiceMonitors for every component and the PrometheusRule with the brief's SLIs and alerts."""

from __future__ import annotations

from apps.core.sizing.plan import FleetPlan
from apps.core.spec import StackSpec
from infra.config import OfficeHours
from infra.manifests.alerts import rule_groups
from infra.manifests.common import (
    MONITORING_NAMESPACE,
    NAMESPACE,
    PROMETHEUS_RELEASE_LABEL,
    Manifest,
    labels,
)


def service_monitor(
    name: str,
    namespace: str,
    selector: dict[str, str],
    port: str,
    path: str = "/metrics",
    target_labels: dict[str, str] | None = None,
) -> Manifest:
    endpoint: Manifest = {"port": port, "path": path, "interval": "15s"}
    if target_labels:
        endpoint["relabelings"] = [
            {"action": "replace", "targetLabel": k, "replacement": v}
            for k, v in sorted(target_labels.items())
        ]
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
            "endpoints": [endpoint],
        },
    }


def service_monitors() -> list[Manifest]:
    return [
        service_monitor("gateway", NAMESPACE, labels("gateway"), "metrics"),
        # The orchestrator's metrics-only port: Prometheus never needs its dispatch port.
        service_monitor("orchestrator", NAMESPACE, labels("orchestrator"), "metrics"),
        # Every vLLM pod here is cloud capacity (on-premises engines are behind NAT, seen through
        # the orchestrator): the cost report's cloud GPU hours select on this label.
        service_monitor(
            "vllm", NAMESPACE, {"app.kubernetes.io/name": "vllm"}, "http", target_labels={"location": "cloud"}
        ),
        service_monitor("agent", NAMESPACE, {"app.kubernetes.io/name": "vllm"}, "agent"),
        service_monitor(
            "dcgm-exporter", MONITORING_NAMESPACE, {"app.kubernetes.io/name": "dcgm-exporter"}, "metrics"
        ),
        service_monitor("keda", "keda", {"app.kubernetes.io/name": "keda-operator"}, "metrics"),
        service_monitor("karpenter", "kube-system", {"app.kubernetes.io/name": "karpenter"}, "http-metrics"),
    ]


def prometheus_rule(spec: StackSpec, plan: FleetPlan, hours: OfficeHours) -> Manifest:
    """The PrometheusRule the operator loads: every group of `infra.manifests.alerts`."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "llmfleet-slis",
            "namespace": MONITORING_NAMESPACE,
            "labels": {**labels("llmfleet"), **PROMETHEUS_RELEASE_LABEL},
        },
        "spec": {"groups": rule_groups(spec, plan, hours)},
    }
