"""Issue 21, exposure: the program's NetworkPolicies and public ingress, evaluated on the rendered
objects of both stacks (who can open a connection to which pod port; which paths the ALB routes)."""

from __future__ import annotations

from typing import Any

from infra.manifests.common import (
    GATEWAY_METRICS_PORT,
    GATEWAY_PORT,
    NODE_PORT,
    ORCHESTRATOR_METRICS_PORT,
    ORCHESTRATOR_PORT,
    VLLM_PORT,
)
from tests.infra.conftest import of_kind

Peer = tuple[str, dict[str, str]]  # (namespace, pod labels)
GATEWAY: Peer = ("llmfleet", {"app.kubernetes.io/name": "gateway", "app.kubernetes.io/part-of": "llmfleet"})
PROMETHEUS: Peer = ("monitoring", {"app.kubernetes.io/name": "prometheus"})
AGENT: Peer = ("llmfleet", {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/part-of": "llmfleet"})
STRANGER: Peer = ("default", {"app": "curl"})


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _peer_matches(rule_peer: dict[str, Any], peer: Peer, policy_ns: str) -> bool:
    namespace, labels = peer
    ns_selector = rule_peer.get("namespaceSelector")
    if ns_selector is None:
        in_ns = namespace == policy_ns
    else:
        in_ns = _selects(ns_selector, {"kubernetes.io/metadata.name": namespace})
    return in_ns and _selects(rule_peer.get("podSelector", {}), labels)


def allowed(kube: list[dict[str, Any]], target: dict[str, str], port: int, peer: Peer) -> bool:
    """Kubernetes semantics: a pod selected by any policy admits what some selecting policy allows."""
    policies = [p for p in of_kind(kube, "NetworkPolicy") if _selects(p["spec"]["podSelector"], target)]
    assert policies, f"no NetworkPolicy selects {target}"
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            ports = [p["port"] for p in rule.get("ports", [])]
            if ports and port not in ports:
                continue
            peers = rule.get("from")
            if peers is None or any(_peer_matches(p, peer, policy["metadata"]["namespace"]) for p in peers):
                return True
    return False


def _pods(kube: list[dict[str, Any]], name: str) -> dict[str, str]:
    for dep in of_kind(kube, "Deployment"):
        labels = dep["spec"]["template"]["metadata"]["labels"]
        if labels.get("app.kubernetes.io/name") == name:
            return dict(labels)
    raise AssertionError(f"no {name} Deployment")


def _scraped_on(kube: list[dict[str, Any]], name: str, port: int) -> None:
    """Prometheus scrapes the `metrics` port (the ServiceMonitor `name` names it), and the
    Deployment `name`'s first container serves its metrics there (`LLMFLEET_METRICS_PORT`)."""
    monitor = next(m for m in of_kind(kube, "ServiceMonitor") if m["metadata"]["name"] == name)
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    dep = next(d for d in of_kind(kube, "Deployment") if d["metadata"]["name"] == name)
    container = dep["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LLMFLEET_METRICS_PORT"] == str(port)
    assert {"name": "metrics", "containerPort": port} in container["ports"]


def test_only_the_gateway_reaches_the_dispatch_port_and_only_prometheus_the_metrics_port(
    kube: list[dict[str, Any]],
) -> None:
    orchestrator = _pods(kube, "orchestrator")
    assert allowed(kube, orchestrator, ORCHESTRATOR_PORT, GATEWAY)
    for peer in (PROMETHEUS, AGENT, STRANGER):
        assert not allowed(kube, orchestrator, ORCHESTRATOR_PORT, peer), peer
    assert allowed(kube, orchestrator, ORCHESTRATOR_METRICS_PORT, PROMETHEUS)
    for peer in (GATEWAY, AGENT, STRANGER):
        assert not allowed(kube, orchestrator, ORCHESTRATOR_METRICS_PORT, peer), peer
    _scraped_on(kube, "orchestrator", ORCHESTRATOR_METRICS_PORT)


def test_nodes_still_reach_the_orchestrators_node_port(kube: list[dict[str, Any]]) -> None:
    orchestrator = _pods(kube, "orchestrator")
    assert allowed(kube, orchestrator, NODE_PORT, AGENT)
    assert allowed(kube, orchestrator, NODE_PORT, STRANGER)  # on-premises nodes come through the ALB
    for dep in of_kind(kube, "Deployment"):
        for container in dep["spec"]["template"]["spec"]["containers"]:
            if container["name"] == "agent":
                url = container["args"][container["args"].index("--orchestrator-url") + 1]
                assert f":{NODE_PORT}/v1/nodes/connect" in url
    orch = next(d for d in of_kind(kube, "Deployment") if d["metadata"]["name"] == "orchestrator")
    env = {e["name"]: e.get("value") for e in orch["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["LLMFLEET_NODE_PORT"] == str(NODE_PORT)


def test_only_prometheus_reaches_the_vllm_pods_and_anyone_the_gateway(kube: list[dict[str, Any]]) -> None:
    vllm = next(
        d["spec"]["template"]["metadata"]["labels"]
        for d in of_kind(kube, "Deployment")
        if d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/name") == "vllm"
    )
    assert allowed(kube, vllm, VLLM_PORT, PROMETHEUS)
    assert not allowed(kube, vllm, VLLM_PORT, GATEWAY)
    gateway = _pods(kube, "gateway")
    assert allowed(kube, gateway, GATEWAY_PORT, STRANGER)
    assert not allowed(kube, gateway, 9999, STRANGER)
    # The gateway's /metrics is on its own port, which only Prometheus reaches.
    assert allowed(kube, gateway, GATEWAY_METRICS_PORT, PROMETHEUS)
    for peer in (STRANGER, AGENT):
        assert not allowed(kube, gateway, GATEWAY_METRICS_PORT, peer), peer
    _scraped_on(kube, "gateway", GATEWAY_METRICS_PORT)


def test_the_public_ingress_routes_only_the_api_admin_and_console(kube: list[dict[str, Any]]) -> None:
    ingresses = {i["metadata"]["name"]: i for i in of_kind(kube, "Ingress")}
    paths = [p["path"] for r in ingresses["gateway"]["spec"]["rules"] for p in r["http"]["paths"]]
    assert sorted(paths) == ["/admin", "/console", "/v1"]
    nodes = ingresses["orchestrator-nodes"]["spec"]["rules"][0]["http"]["paths"]
    assert [(p["path"], p["backend"]["service"]["port"]["number"]) for p in nodes] == [
        ("/v1/nodes/connect", NODE_PORT)
    ]
