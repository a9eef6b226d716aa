"""Cross-object invariants of the rendered program, both stacks (issue 13 items 3, 4, 5, 7, 8, 9).

Each test reads relations between rendered resources that schema validation cannot see:
DaemonSets against the nodes that exist, security groups against the traffic the serving plane
needs, dependencies against the order `pulumi up` must create things in.
"""

from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from apps.core.sizing.plan import plan_fleet
from apps.core.sizing.pools import ON_DEMAND_POOL, pool_demand
from apps.core.spec import load_spec
from apps.gateway.cli import uvicorn_config
from apps.gateway.settings import GatewaySettings
from infra.manifests.common import (
    AGENT_HEALTH_PORT,
    GPU_RESOURCE,
    MODEL_CACHE_MOUNT,
    MODEL_LABEL,
    NAMESPACE,
    NODE_PORT,
    POOL_LABEL,
    VLLM_PORT,
    slug,
)
from infra.render import EKS_CLUSTER_SG
from tests.infra.conftest import STACKS, depends_closure, kube_objects, of_kind, rendered
from tests.infra.test_netpol import PROMETHEUS, STRANGER, allowed

DCGM_PORT = 9400  # dcgm-exporter's metrics port (chart values.yaml service.port)
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "infra"
EKS_SG = json.loads((FIXTURES / "eks-cluster-security-group.json").read_text(encoding="utf-8"))
# amazon-eks-ami releases and the Kubernetes versions each publishes AL2023 AMIs for (source in
# the sidecar next to it): read here directly, not through the program's own check.
AMI_RELEASES = json.loads(
    (Path(__file__).resolve().parents[2] / "infra" / "amis" / "amazon-eks-ami-releases.json").read_text(
        encoding="utf-8"
    )
)
Row = dict[str, Any]


def _rows(stack: str, typ: str) -> list[Row]:
    return [r for r in rendered(stack) if r["type"] == typ]


def _key(r: Row) -> str:
    return f"{r['type']}::{r['name']}"


def _closure(stack: str, row: Row) -> set[str]:
    return depends_closure(rendered(stack), row)


def _releases(stack: str) -> dict[str, Row]:
    return {r["inputs"]["name"]: r for r in _rows(stack, "kubernetes:helm.sh/v3:Release")}


def _node_groups(stack: str) -> list[tuple[dict[str, str], list[dict[str, str]]]]:
    """(labels, taints) of every kind of node: the NodePool templates and the managed node group."""
    out = []
    for r in _rows(stack, "kubernetes:karpenter.sh/v1:NodePool"):
        t = r["inputs"]["spec"]["template"]
        out.append((t["metadata"]["labels"], t["spec"].get("taints", [])))
    for r in _rows(stack, "aws:eks/nodeGroup:NodeGroup"):
        out.append((r["inputs"].get("labels", {}), r["inputs"].get("taints", [])))
    return out


def _tolerates(tolerations: list[dict[str, str]], taint: dict[str, str]) -> bool:
    for t in tolerations:
        if t.get("key") != taint["key"] or t.get("effect", taint["effect"]) != taint["effect"]:
            continue
        if t.get("operator") == "Exists" or t.get("value") == taint.get("value"):
            return True
    return False


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("release", ["nvidia-device-plugin", "dcgm-exporter"])
def test_gpu_daemonsets_land_on_every_gpu_pool(stack: str, release: str) -> None:
    values = _releases(stack)[release]["inputs"]["values"]
    selector: dict[str, str] = values["nodeSelector"]
    matching = [
        (lbl, taints)
        for lbl, taints in _node_groups(stack)
        if all(lbl.get(k) == v for k, v in selector.items())
    ]
    gpu_pools = [t for t in _node_groups(stack) if any(x["key"] == "nvidia.com/gpu" for x in t[1])]
    assert gpu_pools
    assert len(matching) == len(gpu_pools), f"{release}: {selector} matches {len(matching)} of the GPU pools"
    for labels, taints in matching:
        for taint in taints:
            assert _tolerates(values["tolerations"], taint), f"{release} does not tolerate {taint} ({labels})"


def _eks_cluster_sg(stack: str) -> str:
    """The cluster security group's id as the program reads it back from the cluster resource."""
    (tag,) = [r for r in _rows(stack, "aws:ec2/tag:Tag") if r["inputs"]["key"] == "karpenter.sh/discovery"]
    sg_id: str = tag["inputs"]["resourceId"]
    assert sg_id == EKS_CLUSTER_SG  # the mock's clusterSecurityGroupId, i.e. the one EKS made
    return sg_id


def _ingress_rules(stack: str) -> list[tuple[str, dict[str, Any]]]:
    """(security group id, rule) of every rendered ingress, plus the rules EKS gives the cluster
    security group it creates (read from the vendored fixture, with its source)."""
    cluster_sg = _eks_cluster_sg(stack)
    rules: list[tuple[str, dict[str, Any]]] = []
    for rule in EKS_SG["ingress"]:
        sources = [cluster_sg] if rule.get("self") else rule.get("securityGroups", [])
        rules.append((cluster_sg, {**rule, "securityGroups": sources}))
    for r in _rows(stack, "aws:ec2/securityGroup:SecurityGroup"):
        sg_id = f"{r['name']}-id"
        rules.extend((sg_id, rule) for rule in r["inputs"].get("ingress", []))
    for r in _rows(stack, "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"):
        i = r["inputs"]
        rule = {
            "protocol": i.get("ipProtocol"),
            "fromPort": i.get("fromPort", 0),
            "toPort": i.get("toPort", 0),
            "securityGroups": [i["referencedSecurityGroupId"]] if "referencedSecurityGroupId" in i else [],
            "cidrBlocks": [i["cidrIpv4"]] if "cidrIpv4" in i else [],
        }
        rules.append((i["securityGroupId"], rule))
    return rules


def _allows(rule: dict[str, Any], src: set[str], proto: str, port: int) -> bool:
    proto_ok = rule["protocol"] in ("-1", "all", proto)
    port_ok = rule["protocol"] in ("-1", "all") or rule["fromPort"] <= port <= rule["toPort"]
    return proto_ok and port_ok and bool(src & set(rule.get("securityGroups", [])))


def _reachable(stack: str, src: set[str], dst: set[str], proto: str, port: int) -> bool:
    return any(sg in dst and _allows(rule, src, proto, port) for sg, rule in _ingress_rules(stack))


def _gpu_node_groups(stack: str) -> set[str]:
    """Security groups the EC2NodeClass selects: those carrying its selector tags."""
    (node_class,) = _rows(stack, "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass")
    wanted = [t["tags"] for t in node_class["inputs"]["spec"]["securityGroupSelectorTerms"]]
    tagged: dict[str, dict[str, str]] = {}
    for r in _rows(stack, "aws:ec2/tag:Tag"):
        tagged.setdefault(r["inputs"]["resourceId"], {})[r["inputs"]["key"]] = r["inputs"]["value"]
    for r in _rows(stack, "aws:ec2/securityGroup:SecurityGroup"):
        tagged.setdefault(f"{r['name']}-id", {}).update(r["inputs"].get("tags", {}))
    return {
        sg for sg, tags in tagged.items() if any(all(tags.get(k) == v for k, v in w.items()) for w in wanted)
    }


def _port_of_url(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None, url
    return port


def _gpu_pod_ports(stack: str) -> tuple[set[int], set[int]]:
    """From the rendered GPU pods: the ports they dial on the system nodes (the agent's orchestrator
    URL) and the ports they listen on (every container port; scraped and probed from the system nodes)."""
    dial: set[int] = set()
    listen: set[int] = set()
    for r in _rows(stack, "kubernetes:apps/v1:Deployment"):
        pod = r["inputs"]["spec"]["template"]["spec"]
        if not any("nvidia.com/gpu" in c.get("resources", {}).get("limits", {}) for c in pod["containers"]):
            continue
        for c in pod["containers"]:
            args = [str(a) for a in c.get("args", [])]
            dial |= {_port_of_url(args[i + 1]) for i, a in enumerate(args[:-1]) if a == "--orchestrator-url"}
            listen |= {p["containerPort"] for p in c.get("ports", [])}
    return dial, listen


@pytest.mark.parametrize("stack", STACKS)
def test_gpu_and_system_nodes_reach_each_other_on_the_ports_they_need(stack: str) -> None:
    gpu = _gpu_node_groups(stack)
    (system_nodes,) = _rows(stack, "aws:eks/nodeGroup:NodeGroup")
    # A managed node group without a launch template sits in the EKS cluster security group.
    assert "launchTemplate" not in system_nodes["inputs"]
    system = {_eks_cluster_sg(stack)}
    assert gpu, "no security group carries the EC2NodeClass's selector tags: GPU nodes get none"
    dial, listen = _gpu_pod_ports(stack)
    assert dial == {NODE_PORT}, dial  # the agents dial the orchestrator's node port
    assert {VLLM_PORT, AGENT_HEALTH_PORT} <= listen, listen
    needs = [(gpu, system, "udp", 53), (gpu, system, "tcp", 53)]
    needs += [(gpu, system, "tcp", p) for p in sorted(dial)]
    needs += [(system, gpu, "tcp", p) for p in sorted(listen | {DCGM_PORT})]
    missing = [
        (proto, port) for src, dst, proto, port in needs if not _reachable(stack, src, dst, proto, port)
    ]
    assert not missing, f"blocked: {missing}"


@pytest.mark.parametrize("stack", STACKS)
def test_nothing_admits_the_internet(stack: str) -> None:
    for sg, rule in _ingress_rules(stack):
        for cidr in rule.get("cidrBlocks", []) or []:
            assert not ipaddress.ip_network(cidr).is_global, f"{sg} admits {cidr}"


@pytest.mark.parametrize("stack", STACKS)
def test_whatever_names_the_cluster_a_namespace_or_runs_pods_depends_on_it(stack: str) -> None:
    (cluster,) = _rows(stack, "eks:index:Cluster")
    (system,) = _rows(stack, "aws:eks/nodeGroup:NodeGroup")
    namespaces = {
        r["inputs"]["metadata"]["name"]: _key(r) for r in _rows(stack, "kubernetes:core/v1:Namespace")
    }
    for r in rendered(stack):
        deps = _closure(stack, r)
        if "clusterName" in r["inputs"] and r["type"] != "aws:eks/nodeGroup:NodeGroup":
            assert _key(cluster) in deps, f"{_key(r)} names the cluster without depending on it"
        ns = r["inputs"].get("metadata", {}).get("namespace") or (
            r["inputs"].get("namespace") if r["type"] == "kubernetes:helm.sh/v3:Release" else None
        )
        if ns in namespaces:
            assert namespaces[ns] in deps, f"{_key(r)} lives in {ns} without depending on it"
        if r["type"] == "kubernetes:helm.sh/v3:Release":
            assert _key(system) in deps, f"{_key(r)}: its pods need the system nodes"
    (job,) = _rows(stack, "kubernetes:batch/v1:Job")
    instances = {_key(r) for r in _rows(stack, "aws:rds/clusterInstance:ClusterInstance")}
    assert instances
    assert instances <= _closure(stack, job), "the migrate Job does not wait for a database instance"


@pytest.mark.parametrize("stack", STACKS)
def test_every_helm_release_pins_a_chart_version_and_repository(stack: str) -> None:
    for name, r in _releases(stack).items():
        i = r["inputs"]
        assert i.get("version"), name
        repo = i.get("repositoryOpts", {}).get("repo") or (
            i["chart"] if i["chart"].startswith("oci://") else None
        )
        assert repo, f"{name}: no repository"


@pytest.mark.parametrize("stack", STACKS)
def test_brief_behaviour_consolidation_storage_grafana_version(stack: str) -> None:
    for r in _rows(stack, "kubernetes:karpenter.sh/v1:NodePool"):
        assert r["inputs"]["spec"]["disruption"]["consolidationPolicy"] == "WhenEmpty"
    values = _releases(stack)["kube-prometheus-stack"]["inputs"]["values"]
    storage = values["prometheus"]["prometheusSpec"]["storageSpec"]["volumeClaimTemplate"]["spec"]
    classes = {
        r["inputs"]["metadata"]["name"]: r for r in _rows(stack, "kubernetes:storage.k8s.io/v1:StorageClass")
    }
    assert classes[storage["storageClassName"]]["inputs"]["provisioner"] == "ebs.csi.aws.com"
    assert any(r["inputs"]["addonName"] == "aws-ebs-csi-driver" for r in _rows(stack, "aws:eks/addon:Addon"))
    admin = values["grafana"]["admin"]
    secrets = {r["inputs"]["metadata"]["name"] for r in _rows(stack, "kubernetes:core/v1:Secret")}
    assert admin["existingSecret"] in secrets
    # Standard EKS support through December 2026 (1.31 left extended support on 2026-11-26).
    assert load_spec(stack).kubernetes_version == "1.35"
    (cluster,) = _rows(stack, "eks:index:Cluster")
    assert cluster["inputs"]["version"] == "1.35"
    # Every GPU node boots the AMI alias's release for this Kubernetes version: it must exist.
    (node_class,) = _rows(stack, "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass")
    ((term,),) = [node_class["inputs"]["spec"]["amiSelectorTerms"]]
    family, release = term["alias"].split("@")
    assert family == "al2023", term
    assert release in AMI_RELEASES, term
    assert not AMI_RELEASES[release]["abandoned"], release
    assert cluster["inputs"]["version"] in AMI_RELEASES[release]["nvidia"], (
        f"{term['alias']} publishes NVIDIA AMIs for {AMI_RELEASES[release]['nvidia']} only"
    )


@pytest.mark.parametrize("stack", STACKS)
def test_first_up_starts_gpu_deployments_at_zero_and_never_waits_on_them(stack: str) -> None:
    gpu = [
        r
        for r in _rows(stack, "kubernetes:apps/v1:Deployment")
        if r["inputs"]["metadata"]["name"].startswith("vllm-")
    ]
    assert gpu
    for r in gpu:
        assert r["inputs"]["spec"]["replicas"] == 0, r["name"]
        assert r["inputs"]["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true"
    for r in _rows(stack, "kubernetes:keda.sh/v1alpha1:ScaledObject"):
        assert r["inputs"]["metadata"]["annotations"]["autoscaling.keda.sh/paused-replicas"] == "0"
    assert all(r["inputs"]["metadata"].get("namespace") == NAMESPACE for r in gpu)


def _flag_values(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]


@pytest.mark.parametrize("stack", STACKS)
def test_the_pool_token_admits_exactly_the_models_its_pods_register(stack: str) -> None:
    """The deploy Job registers the cloud pool's token for the models the vLLM pods' agents claim,
    so a pod with that token cannot claim any other model (issue 21 item 4)."""
    (job,) = [
        r
        for r in _rows(stack, "kubernetes:batch/v1:Job")
        if r["inputs"]["metadata"]["name"] == "llmfleet-migrate"
    ]
    (register,) = [
        c
        for c in job["inputs"]["spec"]["template"]["spec"]["containers"]
        if "register-node-pool" in c["args"]
    ]
    admitted = set(_flag_values(register["args"], "--model"))
    claimed: set[str] = set()
    for r in _rows(stack, "kubernetes:apps/v1:Deployment"):
        for c in r["inputs"]["spec"]["template"]["spec"]["containers"]:
            if "agent" in c.get("args", []):
                claimed |= set(_flag_values(c["args"], "--model"))
    assert claimed
    assert admitted == claimed == set(load_spec(stack).models)


@pytest.mark.parametrize("stack", STACKS)
def test_the_gateway_keeps_idle_connections_open_longer_than_the_alb(stack: str) -> None:
    """Else the ALB may send a request on a kept-alive connection the gateway is closing: a 502."""
    (ingress,) = [
        r
        for r in _rows(stack, "kubernetes:networking.k8s.io/v1:Ingress")
        if r["inputs"]["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]["name"] == "gateway"
    ]
    attributes = ingress["inputs"]["metadata"]["annotations"][
        "alb.ingress.kubernetes.io/load-balancer-attributes"
    ]
    alb_idle = int(dict(a.split("=") for a in attributes.split(","))["idle_timeout.timeout_seconds"])
    (gateway,) = [
        r
        for r in _rows(stack, "kubernetes:apps/v1:Deployment")
        if r["inputs"]["metadata"]["name"] == "gateway"
    ]
    (container,) = gateway["inputs"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    settings = GatewaySettings.model_validate({"keepalive_s": env["LLMFLEET_KEEPALIVE_S"]})
    assert settings.keepalive_s > alb_idle
    assert uvicorn_config(object(), settings).timeout_keep_alive == settings.keepalive_s


@pytest.mark.parametrize("stack", STACKS)
def test_each_pods_agent_names_the_revision_its_engine_serves_and_model_sync_copied(stack: str) -> None:
    """The agent tells the orchestrator the revision (the ledger records it per request, issue 30):
    it must be the one model-sync verified and copied and vLLM loads, the stack's, in every pod."""
    spec = load_spec(stack)
    seen: set[str] = set()
    for r in _rows(stack, "kubernetes:apps/v1:Deployment"):
        pod = r["inputs"]["spec"]["template"]["spec"]
        containers = [*pod.get("initContainers", []), *pod["containers"]]
        agents = [c for c in containers if "agent" in c.get("args", [])[:1]]
        if not agents:
            continue
        (model,) = _flag_values(agents[0]["args"], "--model")
        said = _flag_values(agents[0]["args"], "--model-revision")
        copied = [
            v for c in containers if c is not agents[0] for v in _flag_values(c.get("args", []), "--revision")
        ]
        assert said == [spec.models[model].revision], (model, agents[0]["args"])
        assert copied, model
        assert set(copied) == set(said), (model, copied)
        seen.add(model)
    assert seen == set(spec.models)


@pytest.mark.parametrize("stack", STACKS)
def test_the_embedding_model_is_copied_served_scraped_scaled_and_placed(stack: str) -> None:
    """Issue 31: the embedding model's objects fit each other and the rest as every model's do. Its
    model-sync copies the registry revision its pooling engine loads, its Service and NetworkPolicy
    reach its pods, its ScaledObject scales its Deployment on series a pooling engine exports, and its
    pods land on a NodePool that admits them and whose GPU limit counts its replica maximum."""
    spec = load_spec(stack)
    (model,) = [n for n, m in spec.models.items() if m.serving.task == "embed"]
    revision = spec.models[model].revision
    kube = kube_objects(stack)
    deployments = of_kind(kube, "Deployment")
    (dep,) = [d for d in deployments if d["metadata"]["labels"].get(MODEL_LABEL) == slug(model)]
    pod = dep["spec"]["template"]
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    (sync,) = pod["spec"]["initContainers"]
    assert (_flag_values(sync["args"], "--model"), _flag_values(sync["args"], "--revision")) == (
        [model],
        [revision],
    )
    assert _flag_values(sync["args"], "--dest") == [MODEL_CACHE_MOUNT]
    vllm = containers["vllm"]["args"]
    assert _flag_values(vllm, "--model") == [f"{MODEL_CACHE_MOUNT}/{model}/{revision}"]
    assert _flag_values(vllm, "--runner") == ["pooling"]
    mounts = {m["name"]: m["mountPath"] for c in (sync, containers["vllm"]) for m in c["volumeMounts"]}
    assert mounts["models"] == MODEL_CACHE_MOUNT  # the volume model-sync fills is the one vLLM reads
    assert _flag_values(containers["agent"]["args"], "--model") == [model]

    labels = pod["metadata"]["labels"]
    (service,) = [s for s in of_kind(kube, "Service") if s["metadata"]["name"] == f"vllm-{slug(model)}"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert allowed(kube, labels, VLLM_PORT, PROMETHEUS)
    assert allowed(kube, labels, AGENT_HEALTH_PORT, PROMETHEUS)
    assert not allowed(kube, labels, VLLM_PORT, STRANGER)

    name = dep["metadata"]["name"]
    (so,) = [o for o in of_kind(kube, "ScaledObject") if o["spec"]["scaleTargetRef"]["name"] == name]
    queries = " ".join(t["metadata"]["query"] for t in so["spec"]["triggers"] if t["type"] == "prometheus")
    # Both are exported by vLLM 0.32's pooling runner (one per input being embedded); no KV-cache use.
    read = set(re.findall(r"vllm:[a-z_]+", queries))
    assert read == {"vllm:num_requests_running", "vllm:num_requests_waiting"}

    pools = {p["metadata"]["name"]: p for p in of_kind(kube, "NodePool")}
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    expressions = [e for t in terms["nodeSelectorTerms"] for e in t["matchExpressions"]]
    wanted = {v for e in expressions if e["key"] == POOL_LABEL for v in e["values"]}
    assert wanted == {ON_DEMAND_POOL} <= set(pools)
    pool = pools[ON_DEMAND_POOL]["spec"]
    for taint in pool["template"]["spec"]["taints"]:
        assert _tolerates(pod["spec"]["tolerations"], taint), taint
    (demand,) = [d for d in pool_demand(spec, plan_fleet(spec)) if d.pool == ON_DEMAND_POOL]
    assert demand.per_model[model] == spec.models[model].serving.replicas.max  # one 1-GPU node each
    assert pool["limits"][GPU_RESOURCE] == demand.gpus == sum(demand.per_model.values())
