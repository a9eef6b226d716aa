"""NetworkPolicies of the llmfleet namespace: who may open a connection to which pod port.

* gateway, port 8080: anyone (the ALB's IP targets and in-cluster clients); `/metrics` is not
  served there but on the metrics port 8084 (`LLMFLEET_METRICS_PORT`), which only Prometheus
  reaches. The public ingress routes only `/v1/*`, `/admin/*`, `/console/*`.
* orchestrator, main port 8081 (dispatch, the internal node calls): only the gateway pods.
  Dispatch also needs the internal token.
* orchestrator, metrics port 8083 (`/metrics` and health checks only, `LLMFLEET_METRICS_PORT`):
  only Prometheus (the monitoring namespace).
* orchestrator, node port 8082 (the node WebSocket and health checks only, `--node-port`):
  anyone: on-premises nodes through the ALB and the cloud nodes' agent sidecars.
* vLLM pods (the engine 8000, the agent's health/metrics 8090): only Prometheus. The agent
  reaches its engine over localhost, which no NetworkPolicy filters.
Everything else arriving at a pod of the namespace is denied (the policies select every pod).
"""

from __future__ import annotations

from infra.manifests.common import (
    AGENT_HEALTH_PORT,
    GATEWAY_METRICS_PORT,
    GATEWAY_PORT,
    MONITORING_NAMESPACE,
    NAMESPACE,
    NODE_PORT,
    ORCHESTRATOR_METRICS_PORT,
    ORCHESTRATOR_PORT,
    VLLM_PORT,
    Manifest,
    labels,
    meta,
)

PROMETHEUS_PEER: Manifest = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": MONITORING_NAMESPACE}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}


def _selector(component: str) -> Manifest:
    return {"matchLabels": {"app.kubernetes.io/name": component}}


def _policy(name: str, component: str | None, rules: list[Manifest]) -> Manifest:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta(name, "netpol"),
        "spec": {
            "podSelector": _selector(component) if component else {},
            "policyTypes": ["Ingress"],
            "ingress": rules,
        },
    }


def _tcp(*ports: int) -> list[Manifest]:
    return [{"protocol": "TCP", "port": port} for port in ports]


def network_policies() -> list[Manifest]:
    gateway_peer = {"podSelector": {"matchLabels": labels("gateway")}}
    return [
        _policy("default-deny-ingress", None, []),
        _policy("gateway-from-anywhere", "gateway", [{"ports": _tcp(GATEWAY_PORT)}]),
        _policy(
            "gateway-metrics-port",
            "gateway",
            [{"from": [PROMETHEUS_PEER], "ports": _tcp(GATEWAY_METRICS_PORT)}],
        ),
        _policy(
            "orchestrator-main-port",
            "orchestrator",
            [{"from": [gateway_peer], "ports": _tcp(ORCHESTRATOR_PORT)}],
        ),
        _policy(
            "orchestrator-metrics-port",
            "orchestrator",
            [{"from": [PROMETHEUS_PEER], "ports": _tcp(ORCHESTRATOR_METRICS_PORT)}],
        ),
        _policy("orchestrator-node-port", "orchestrator", [{"ports": _tcp(NODE_PORT)}]),
        _policy(
            "vllm-from-prometheus",
            "vllm",
            [{"from": [PROMETHEUS_PEER], "ports": _tcp(VLLM_PORT, AGENT_HEALTH_PORT)}],
        ),
    ]


__all__ = ["NAMESPACE", "network_policies"]
