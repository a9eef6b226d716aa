"""Invariants of the rendered program for both stacks (issue 6, "Offline verification")."""

from __future__ import annotations

import json
from typing import Any

from apps.core.sizing.plan import FleetPlan, plan_fleet
from apps.core.spec import StackSpec, load_spec
from infra.components.serving import serving_objects
from infra.config import OfficeHours
from infra.manifests.common import GPU_RESOURCE, GPU_TAINT, SPOT_TAINT_KEY, slug
from infra.manifests.iam import is_scoped
from infra.manifests.keda import (
    KV_CACHE_TARGET,
    ORCHESTRATOR_QUEUE_METRIC,
    demand_query,
    kv_query,
    scale_down_window_s,
    startup_budget_s,
    streams_target,
    waiting_threshold,
)
from tests.infra.conftest import kube_objects, of_kind, program, upstream_controller_policies


def _arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def _vllm_pods(kube: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    out = []
    for dep in of_kind(kube, "Deployment"):
        pod = dep["spec"]["template"]["spec"]
        for c in pod["containers"]:
            if c["name"] == "vllm":
                out.append((dep, pod))
    return out


def _model_of(pod: dict[str, Any]) -> str:
    vllm = next(c for c in pod["containers"] if c["name"] == "vllm")
    return _arg(vllm["args"], "--served-model-name")


def test_every_gpu_pod_tolerates_the_taint_and_requests_whole_gpus(
    kube: list[dict[str, Any]], plan: FleetPlan
) -> None:
    pods = _vllm_pods(kube)
    assert pods
    for dep, pod in pods:
        tolerations = pod["tolerations"]
        assert any(t["key"] == GPU_TAINT["key"] and t["effect"] == "NoSchedule" for t in tolerations), dep
        vllm = next(c for c in pod["containers"] if c["name"] == "vllm")
        mp = plan.models[_model_of(pod)]
        assert vllm["resources"]["limits"][GPU_RESOURCE] == str(mp.gpus_per_replica)
        assert vllm["resources"]["requests"][GPU_RESOURCE] == str(mp.gpus_per_replica)
        assert _arg(vllm["args"], "--tensor-parallel-size") == str(mp.gpus_per_replica)


def test_vllm_flags_equal_the_planner(kube: list[dict[str, Any]], plan: FleetPlan) -> None:
    seen = set()
    for _, pod in _vllm_pods(kube):
        name = _model_of(pod)
        seen.add(name)
        mp = plan.models[name]
        args = next(c for c in pod["containers"] if c["name"] == "vllm")["args"]
        assert _arg(args, "--max-num-seqs") == str(mp.max_num_seqs)
        assert _arg(args, "--max-model-len") == str(mp.max_model_len)
        # The orchestrator sends the request's class as vLLM's `priority` (batch is non-zero).
        assert _arg(args, "--scheduling-policy") == "priority"
        agent = next(c for c in pod["containers"] if c["name"] == "agent")["args"]
        assert _arg(agent, "--max-num-seqs") == str(mp.max_num_seqs)
        assert _arg(agent, "--location") == "cloud"
    assert seen == set(plan.models)


# Flags that configure decoding, the KV cache or what only a generate engine reports.
GENERATION_ONLY = {
    "--block-size",
    "--enable-prefix-caching",
    "--enable-prompt-tokens-details",
    "--kv-events-config",
    "--speculative-config",
    "--num-speculative-tokens",
    "--enable-chunked-prefill",
}


def test_an_embed_models_engine_runs_the_pooling_runner_and_a_generate_models_does_not(
    kube: list[dict[str, Any]], spec: StackSpec
) -> None:
    """An embed model's vLLM serves `/v1/embeddings` with `--runner pooling` and no generation-only
    flag, its agent forwards no KV events; a generate model's runs vLLM's default runner with them."""
    tasks: set[str] = set()
    for dep, pod in _vllm_pods(kube):
        model = _model_of(pod)
        task = spec.models[model].serving.task
        tasks.add(task)
        args = next(c for c in pod["containers"] if c["name"] == "vllm")["args"]
        agent = next(c for c in pod["containers"] if c["name"] == "agent")["args"]
        runners = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--runner"]
        if task == "embed":
            assert runners == ["pooling"], dep["metadata"]["name"]
            assert not GENERATION_ONLY & set(args), dep["metadata"]["name"]
            assert not any(a.startswith("--kv-events") for a in agent), dep["metadata"]["name"]
        else:
            assert runners == [], dep["metadata"]["name"]  # vLLM's default: generate for these
            assert "--kv-events-config" in args
            assert "--kv-events-endpoint" in agent
        assert _arg(args, "--scheduling-policy") == "priority"  # both schedulers take the classes
    assert tasks == {"embed", "generate"}  # the stack has both: neither branch is vacuous


def test_prod_matches_the_brief() -> None:
    kube = kube_objects("prod")
    flags = {}
    for _, pod in _vllm_pods(kube):
        args = next(c for c in pod["containers"] if c["name"] == "vllm")["args"]
        flags[_model_of(pod)] = (
            _arg(args, "--tensor-parallel-size"),
            _arg(args, "--max-model-len"),
            _arg(args, "--max-num-seqs"),
        )
    assert flags["llama-3.1-8b-instruct"] == ("1", "8192", "64")
    assert flags["qwen2.5-32b-instruct"][0] == "2"
    assert flags["llama-3.3-70b-instruct-fp8"][0] == "4"


def _replica_bounds(kube: list[dict[str, Any]], model: str) -> tuple[int, int]:
    deps = {d["metadata"]["name"]: d for d in of_kind(kube, "Deployment")}
    low = high = 0
    for so in of_kind(kube, "ScaledObject"):
        target = so["spec"]["scaleTargetRef"]["name"]
        if deps[target]["metadata"]["labels"].get("llmfleet.io/model") == slug(model):
            low += so["spec"]["minReplicaCount"]
            high += so["spec"]["maxReplicaCount"]
    keda_targets = {so["spec"]["scaleTargetRef"]["name"] for so in of_kind(kube, "ScaledObject")}
    for name, dep in deps.items():
        fixed = "replicas" in dep["spec"] and name not in keda_targets  # KEDA's start at 0
        if dep["metadata"]["labels"].get("llmfleet.io/model") == slug(model) and fixed:
            low += dep["spec"]["replicas"]
            high += dep["spec"]["replicas"]
    return low, high


def _base_replicas(kube: list[dict[str, Any]], so: dict[str, Any]) -> int:
    """Fixed replicas of the same model outside this ScaledObject (the on-demand floor)."""
    model = so["metadata"]["labels"]["llmfleet.io/model"]
    return sum(
        d["spec"].get("replicas", 0)
        for d in of_kind(kube, "Deployment")
        if d["metadata"]["labels"].get("llmfleet.io/model") == model
        and d["metadata"]["name"] != so["spec"]["scaleTargetRef"]["name"]
    )


def test_replica_bounds_and_keda_thresholds_come_from_the_spec(spec: StackSpec, plan: FleetPlan) -> None:
    # The serving plane once the weights are uploaded (`llmfleet:scaleModels true`).
    kube = serving_objects(spec, plan, OfficeHours(), "agent", "bucket", scale_models=True)
    for name, mp in plan.models.items():
        assert _replica_bounds(kube, name) == (mp.min_replicas, mp.max_replicas), name
    for so in of_kind(kube, "ScaledObject"):
        s = so["spec"]
        by_name = {t["name"]: t for t in s["triggers"]}
        model = by_name["demand"]["metadata"]["query"].split('"')[1]
        mp = plan.models[model]
        window = s["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
        assert window["stabilizationWindowSeconds"] == scale_down_window_s(mp) >= startup_budget_s(mp)
        assert s["cooldownPeriod"] >= startup_budget_s(mp), "1 -> 0 cannot undo a start not yet ready"
        base = _base_replicas(kube, so)
        per_replica = streams_target(mp, spec.models[model].serving.headroom)
        assert by_name["demand"]["metadata"]["threshold"] == f"{per_replica:g}"
        assert by_name["demand"]["metadata"]["query"] == demand_query(model, base, per_replica)
        if mp.task == "embed":  # no KV cache: vllm:kv_cache_usage_perc stays 0, nothing to scale on
            assert "vllm-kv-cache" not in by_name
        else:
            assert by_name["vllm-kv-cache"]["metadata"]["threshold"] == str(KV_CACHE_TARGET)
            assert by_name["vllm-kv-cache"]["metadata"]["query"] == kv_query(model, base)
        for trigger in s["triggers"]:
            assert all(isinstance(v, str) for v in trigger["metadata"].values()), trigger
            if trigger["type"] == "prometheus":
                query = trigger["metadata"]["query"]
                assert query.startswith(("sum(", "clamp_min(", "max_over_time(")), "one series only"
                assert " by " not in query, "one series only"
        # KEDA webhook rules the CRD schema does not carry
        assert s["minReplicaCount"] <= s["maxReplicaCount"]
        assert len(by_name) == len(s["triggers"]), "trigger names unique"
        assert len(f"keda-hpa-{so['metadata']['name']}") <= 63


def test_eight_b_keeps_two_on_demand_replicas_in_prod() -> None:
    spec = load_spec("prod")
    kube = serving_objects(spec, plan_fleet(spec), OfficeHours(), "agent", "bucket", scale_models=True)
    base = next(
        d for d in of_kind(kube, "Deployment") if d["metadata"]["name"] == "vllm-llama-3-1-8b-instruct"
    )
    assert base["spec"]["replicas"] >= 2
    terms = base["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]} in terms[
        "nodeSelectorTerms"
    ][0]["matchExpressions"]


def test_spot_pool_admits_only_the_spot_model(kube: list[dict[str, Any]], spec: StackSpec) -> None:
    spot_model = next(n for n, m in spec.models.items() if m.serving.spot)
    pools = {p["metadata"]["name"]: p for p in of_kind(kube, "NodePool")}
    spot = pools["gpu-l40s-spot"]["spec"]["template"]["spec"]
    assert {"key": SPOT_TAINT_KEY, "value": spot_model, "effect": "NoSchedule"} in spot["taints"]
    assert {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]} in spot["requirements"]
    for _, pod in _vllm_pods(kube):
        if any(t["key"] == SPOT_TAINT_KEY for t in pod["tolerations"]):
            assert _model_of(pod) == spot_model
    for pool in pools.values():
        s = pool["spec"]
        assert GPU_TAINT in s["template"]["spec"]["taints"]
        assert s["disruption"]["consolidateAfter"] == "10m"
        assert s["limits"][GPU_RESOURCE] > 0


def test_every_model_scales_on_the_orchestrator_queue_and_activation_cannot_flap(
    kube: list[dict[str, Any]], spec: StackSpec, plan: FleetPlan
) -> None:
    """Issue 18: the 32B (min 1) read no queue on main; activation read an instant value."""
    objects = of_kind(kube, "ScaledObject")
    assert {so["metadata"]["labels"]["llmfleet.io/model"] for so in objects} == {slug(m) for m in spec.models}
    for so in objects:
        demand = next(t for t in so["spec"]["triggers"] if t["name"] == "demand")
        query = demand["metadata"]["query"]
        assert f'sum({ORCHESTRATOR_QUEUE_METRIC}{{model="' in query, so["metadata"]["name"]
        assert "[2m:15s]" in query
        assert "max_over_time(" in query
        if so["spec"]["minReplicaCount"] > 0:
            continue
        activation = int(demand["metadata"]["activationThreshold"])
        model = query.split('"')[1]
        serving = spec.models[model].serving
        # The on-demand floor under a spot burst (rendered at 0 replicas until `scaleModels`).
        if serving.spot and max(serving.on_demand_min_replicas, plan.models[model].min_replicas) > 0:
            assert activation == waiting_threshold(plan.models[model], spec.slo.queue_wait_p95_s) > 1
        else:
            assert activation == 0, so["metadata"]["name"]
    seventy = plan.models["llama-3.3-70b-instruct-fp8"]
    assert seventy.min_replicas == 0


def test_seventy_b_office_hours_cron_in_prod() -> None:
    kube = kube_objects("prod")
    so = next(s for s in of_kind(kube, "ScaledObject") if "70b" in s["metadata"]["name"])
    cron = [t for t in so["spec"]["triggers"] if t["type"] == "cron"]
    assert cron
    assert cron[0]["metadata"]["desiredReplicas"] == "1"


def test_no_security_group_opens_anything_to_the_internet(resources: list[dict[str, Any]]) -> None:
    groups = [r for r in resources if r["type"] == "aws:ec2/securityGroup:SecurityGroup"]
    assert groups
    for group in groups:
        for rule in group["inputs"].get("ingress", []):
            assert "0.0.0.0/0" not in rule.get("cidrBlocks", []), group["name"]
            assert "::/0" not in rule.get("ipv6CidrBlocks", []), group["name"]
    for r in resources:
        if r["type"] == "aws:rds/clusterInstance:ClusterInstance":
            assert r["inputs"]["publiclyAccessible"] is False


def test_every_iam_policy_is_scoped(resources: list[dict[str, Any]]) -> None:
    """Mutations on `Resource: "*"` need a condition, unless the controller's upstream policy for
    the pinned chart grants that action unconditionally (the LBC's backend security-group rules)."""
    policies = [r for r in resources if r["type"] == "aws:iam/rolePolicy:RolePolicy"]
    assert len(policies) >= 3
    upstream = upstream_controller_policies()
    for r in policies:
        assert is_scoped(json.loads(r["inputs"]["policy"]), upstream.get(r["name"])) == [], r["name"]
    for r in resources:
        if r["type"] == "aws:iam/role:Role":
            trust = json.loads(r["inputs"]["assumeRolePolicy"])
            for stmt in trust["Statement"]:
                if "Federated" in stmt["Principal"]:
                    assert "StringEquals" in stmt["Condition"], r["name"]


def test_model_sync_reads_only_the_model_bucket_and_only_verifies_with_the_signing_key(
    resources: list[dict[str, Any]],
) -> None:
    policy = next(
        r for r in resources if r["name"] == "serving-model-sync" and r["type"].endswith("RolePolicy")
    )
    doc = json.loads(policy["inputs"]["policy"])
    actions = {a for s in doc["Statement"] for a in s["Action"]}
    assert actions == {"s3:ListBucket", "s3:GetObject", "kms:Verify"}  # never kms:Sign
    for stmt in doc["Statement"]:
        assert all(res.startswith("arn:") and "models" in res for res in stmt["Resource"])
    [verify] = [s for s in doc["Statement"] if s["Action"] == ["kms:Verify"]]
    assert verify["Resource"] == ["arn:aws:mock:us-east-1:123456789012:models-signing"]


def test_the_model_signing_key_signs_and_verifies_with_ecdsa_p256(resources: list[dict[str, Any]]) -> None:
    [key] = [r["inputs"] for r in resources if r["type"] == "aws:kms/key:Key"]
    assert (key["keyUsage"], key["customerMasterKeySpec"]) == ("SIGN_VERIFY", "ECC_NIST_P256")
    [alias] = [r["inputs"] for r in resources if r["type"] == "aws:kms/alias:Alias"]
    assert alias["name"].startswith("alias/llmfleet-")
    assert alias["name"].endswith("-model-signing")
    assert alias["targetKeyId"].startswith("key-")


def test_bucket_is_versioned_encrypted_and_private(resources: list[dict[str, Any]]) -> None:
    types = {r["type"]: r["inputs"] for r in resources}
    assert types["aws:s3/bucketVersioning:BucketVersioning"]["versioningConfiguration"]["status"] == "Enabled"
    block = types["aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"]
    assert all(
        block[k] is True
        for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
    )


def test_secrets_are_masked(resources: list[dict[str, Any]]) -> None:
    text = json.dumps(resources)
    assert "mock-" not in text.replace("mock-nodes", "")
    secrets = [r for r in resources if r["type"] == "kubernetes:core/v1:Secret"]
    assert secrets
    assert all(r["inputs"]["stringData"] == "[secret]" for r in secrets)


def test_every_component_parents_its_children(stack: str) -> None:
    result = program(stack)
    components = {r["type"] for r in result.rows if r["type"].startswith("llmfleet:infra:")}
    assert {
        "llmfleet:infra:Network",
        "llmfleet:infra:Cluster",
        "llmfleet:infra:Karpenter",
        "llmfleet:infra:Addons",
        "llmfleet:infra:ModelServing",
        "llmfleet:infra:PlatformApps",
        "llmfleet:infra:Database",
        "llmfleet:infra:Cache",
        "llmfleet:infra:ModelBucket",
        "llmfleet:infra:Images",
        "llmfleet:infra:Observability",
    } <= components
    for row in result.rows:
        parent = result.parents[(row["type"], row["name"])]
        if row["type"].startswith("llmfleet:infra:"):
            assert parent == "pulumi:pulumi:Stack", row["name"]
        else:
            assert parent.startswith("llmfleet:infra:"), f"{row['type']} {row['name']} has parent {parent!r}"


def test_dev_is_small() -> None:
    dev = plan_fleet(load_spec("dev"))
    assert dev.models["llama-3.1-8b-instruct"].replicas == 1
    assert dev.models["qwen2.5-32b-instruct"].min_replicas == 0
    assert dev.models["llama-3.3-70b-instruct-fp8"].min_replicas == 0
    assert (dev.models["bge-m3"].min_replicas, dev.models["bge-m3"].max_replicas) == (0, 1)
    spec = load_spec("dev")
    kube = serving_objects(spec, dev, OfficeHours(), "agent", "bucket", scale_models=True)
    bounds = _replica_bounds(kube, "llama-3.1-8b-instruct")
    assert bounds == (1, 2)


def test_every_model_sync_verifies_with_the_programs_signing_key(kube: list[dict[str, Any]]) -> None:
    inits = [
        c
        for o in kube
        if o["kind"] == "Deployment" and o["metadata"]["name"].startswith("vllm-")
        for c in o["spec"]["template"]["spec"]["initContainers"]
    ]
    assert inits
    for init in inits:
        assert init["args"][0] == "model-sync"
        assert init["env"] == [
            {
                "name": "LLMFLEET_MODEL_SIGNING_KEY",
                "value": "arn:aws:mock:us-east-1:123456789012:models-signing",
            }
        ]
