"""Canary by model version (issue 30): a model with `canary` set runs one Deployment per live revision,
each with its own ScaledObject and PDB, rendered through the whole program (Pulumi mocks) from a
test-only stack: prod with a canary on the spot model (on-demand floor + spot burst) and on a
plain one whose revision is not a label value. The shipped stacks have none (their golden files
are today's)."""

from __future__ import annotations

import copy
import re
import tempfile
from functools import cache
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml

import apps.core.spec as spec_module
import tests.infra.test_schemas as schemas
from apps.core.sizing.plan import plan_fleet
from apps.core.spec import STACKS_DIR, StackSpec, load_spec, parse_spec
from infra.components.serving import serving_objects
from infra.config import InfraConfig, OfficeHours
from infra.manifests.common import MODEL_CACHE_MOUNT, REVISION_SLUG_LABEL, VLLM_PORT, revision_slug, slug
from infra.manifests.karpenter import gpu_pool_spec
from infra.manifests.keda import ORCHESTRATOR_COLD_START_METRIC, ORCHESTRATOR_QUEUE_METRIC
from infra.manifests.vllm import deployment_name
from infra.manifests.vllm_target import Capacity
from infra.render import RENDER_CERTIFICATE_ARN, RENDER_IMAGE_TAG, render_program
from tests.infra.conftest import of_kind
from tests.infra.test_netpol import PROMETHEUS, STRANGER, allowed

Obj = dict[str, Any]
STACK = "canary"
SPOT_MODEL = "llama-3.1-8b-instruct"
PLAIN_MODEL = "qwen2.5-32b-instruct"
CANARIES: dict[str, Obj] = {
    SPOT_MODEL: {"revision": "2026-12-01"},
    PLAIN_MODEL: {"revision": "v2+fp8~rc1", "min_replicas": 1, "max_replicas": 3},  # '+', '~': no label value
}
LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def canary_data() -> Obj:
    data: Obj = yaml.safe_load((STACKS_DIR / "prod.yaml").read_text(encoding="utf-8"))
    data["name"] = STACK
    for model, canary in CANARIES.items():
        data["models"][model]["canary"] = canary
    return data


@cache
def canary_spec() -> StackSpec:
    return parse_spec(canary_data(), "canary.yaml")


@cache
def canary_kube() -> list[Obj]:
    """The Kubernetes objects of the whole program rendered from the canary stack."""
    data = canary_data()
    # The program loads its stack by name (and so does the migrate Job's renderer): from here.
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(spec_module, "STACKS_DIR", Path(tmp)):
        (Path(tmp) / f"{STACK}.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
        config = InfraConfig(stack=STACK, image_tag=RENDER_IMAGE_TAG, certificate_arn=RENDER_CERTIFICATE_ARN)
        rows = render_program(STACK, config).rows
    return [r["inputs"] for r in rows if r["type"].startswith("kubernetes:") and "kind" in r["inputs"]]


def _arg(args: list[str], flag: str) -> str:
    (value,) = [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]
    return value


def _vllm_deployments(kube: list[Obj]) -> list[Obj]:
    return [d for d in of_kind(kube, "Deployment") if d["metadata"]["name"].startswith("vllm-")]


def _model_of(dep: Obj) -> str:
    (vllm,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
    return _arg(vllm["args"], "--served-model-name")


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def _overlaps(deployments: list[Obj]) -> list[tuple[str, str]]:
    """(A, B) where A's selector matches B's pods, A not B: the Deployments would fight over pods."""
    return [
        (a["metadata"]["name"], b["metadata"]["name"])
        for a in deployments
        for b in deployments
        if a is not b
        and _selects(a["spec"]["selector"]["matchLabels"], b["spec"]["template"]["metadata"]["labels"])
    ]


def test_one_deployment_per_live_revision_with_disjoint_selectors() -> None:
    kube = canary_kube()
    deps = _vllm_deployments(kube)
    by_model: dict[str, set[str]] = {}
    for dep in deps:
        by_model.setdefault(_model_of(dep), set()).add(dep["metadata"]["name"])
        assert _selects(dep["spec"]["selector"]["matchLabels"], dep["spec"]["template"]["metadata"]["labels"])
    s8, s32, s70, embedding = (f"vllm-{slug(m)}" for m in canary_spec().models)
    assert by_model == {
        SPOT_MODEL: {s8, f"{s8}-spot", f"{s8}-canary"},
        PLAIN_MODEL: {s32, f"{s32}-canary"},
        "llama-3.3-70b-instruct-fp8": {s70},
        "bge-m3": {embedding},
    }
    assert _overlaps(of_kind(kube, "Deployment")) == []
    # The check sees an overlap: a canary whose pods carried the stable capacity label would be
    # matched by the stable on-demand Deployment's selector (a Deployment's selector is immutable).
    canary = next(d for d in deps if d["metadata"]["name"] == f"{s32}-canary")
    bad = copy.deepcopy(canary)
    bad["spec"]["template"]["metadata"]["labels"]["llmfleet.io/capacity"] = "on-demand"
    assert (s32, f"{s32}-canary") in _overlaps([*(d for d in deps if d is not canary), bad])


def test_each_scaled_object_targets_its_own_deployment() -> None:
    kube = canary_kube()
    spec = canary_spec()
    deps = {d["metadata"]["name"]: d for d in of_kind(kube, "Deployment")}
    targets = [so["spec"]["scaleTargetRef"]["name"] for so in of_kind(kube, "ScaledObject")]
    assert len(targets) == len(set(targets)), targets
    assert set(targets) <= set(deps)
    for model, raw in CANARIES.items():
        name = deployment_name(model, Capacity.ON_DEMAND, canary=True)
        (so,) = [s for s in of_kind(kube, "ScaledObject") if s["spec"]["scaleTargetRef"]["name"] == name]
        assert so["metadata"]["name"] == name
        canary = spec.models[model].canary
        assert canary is not None
        assert (
            (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"])
            == (
                canary.min_replicas,
                canary.max_replicas,
            )
            == (raw.get("min_replicas", 1), raw.get("max_replicas", 2))
        )
        # First `up`: KEDA paused at 0, the Deployment at 0 and not waited on, like every GPU Deployment.
        assert so["metadata"]["annotations"]["autoscaling.keda.sh/paused-replicas"] == "0"
        assert deps[name]["spec"]["replicas"] == 0
        assert deps[name]["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true"
        assert len(f"keda-hpa-{name}") <= 63
    assert sum(t.endswith("-canary") for t in targets) == len(CANARIES)


def _pod_name(deployment: str) -> str:
    """A pod's name as the Deployment and ReplicaSet controllers make it."""
    return f"{deployment}-6b9f7c5d48-x7k2p"


def _vllm_series_pods(query: str) -> list[tuple[str, str]]:
    """(operator, regex) of the `pod` matcher of every vLLM selector in `query` ("", "" without one)."""
    out = []
    for selector in re.findall(r"vllm:[a-z_]+\{([^}]*)\}", query):
        m = re.search(r'pod(=~|!~)"([^"]*)"', selector)
        out.append((m.group(1), m.group(2)) if m else ("", ""))
    return out


def _counts(op: str, regex: str, pod: str) -> bool:
    if not op:
        return True
    hit = re.fullmatch(regex, pod) is not None  # PromQL regex matchers are anchored
    return hit if op == "=~" else not hit


def test_each_scaled_object_reads_only_its_own_revisions_engines() -> None:
    """Both revisions serve one model name: the pod name tells their vLLM series apart. The canary
    scales on its own pods' load (without the model's orchestrator queue); every other Deployment
    of the model on the model's demand less the canary's pods."""
    kube = canary_kube()
    deps = {d["metadata"]["name"]: d for d in _vllm_deployments(kube)}
    for so in of_kind(kube, "ScaledObject"):
        target = so["spec"]["scaleTargetRef"]["name"]
        model = _model_of(deps[target])
        siblings = [n for n, d in deps.items() if _model_of(d) == model]
        canary = target.endswith("-canary")
        for trigger in so["spec"]["triggers"]:
            if trigger["type"] != "prometheus":
                assert not canary, trigger  # no office-hours cron for a canary
                continue
            query = trigger["metadata"]["query"]
            matchers = _vllm_series_pods(query)
            assert matchers, query
            for op, regex in matchers:
                read = {n for n in siblings if _counts(op, regex, _pod_name(n))}
                if model not in CANARIES:
                    assert op == "", query
                elif canary:
                    assert read == {target}, (target, query)
                else:
                    assert read == set(siblings) - {deployment_name(model, Capacity.ON_DEMAND, True)}, query
            queue_terms = ORCHESTRATOR_QUEUE_METRIC in query, ORCHESTRATOR_COLD_START_METRIC in query
            if trigger["name"] == "demand":
                assert queue_terms == ((False, False) if canary else (True, True)), query


def test_each_pod_copies_serves_and_registers_its_own_revision() -> None:
    spec = canary_spec()
    seen: dict[str, set[str]] = {}
    for dep in _vllm_deployments(canary_kube()):
        model = _model_of(dep)
        canary = dep["metadata"]["name"].endswith("-canary")
        canary_spec_ = spec.models[model].canary
        expected = canary_spec_.revision if canary and canary_spec_ else spec.models[model].revision
        template = dep["spec"]["template"]
        pod = template["spec"]
        (sync,) = pod["initContainers"]
        containers = {c["name"]: c for c in pod["containers"]}
        assert _arg(sync["args"], "--model") == model
        assert _arg(sync["args"], "--revision") == expected
        assert _arg(sync["args"], "--dest") == MODEL_CACHE_MOUNT
        assert _arg(containers["vllm"]["args"], "--model") == f"{MODEL_CACHE_MOUNT}/{model}/{expected}"
        assert _arg(containers["agent"]["args"], "--model") == model
        assert _arg(containers["agent"]["args"], "--model-revision") == expected
        assert template["metadata"]["annotations"]["llmfleet.io/revision"] == expected
        label = template["metadata"]["labels"].get(REVISION_SLUG_LABEL)
        if canary:
            assert label == revision_slug(expected)
            assert LABEL_VALUE.fullmatch(label), label
            assert len(label) <= 63, label
            assert dep["metadata"]["labels"][REVISION_SLUG_LABEL] == label
            # A canary runs on on-demand capacity: it does not tolerate the spot pool's taint.
            assert not any(t["key"] == "llmfleet.io/spot-model" for t in pod["tolerations"])
        else:
            assert label is None  # the stable pods are today's
        seen.setdefault(model, set()).add(expected)
    assert seen == {
        name: {m.revision, *([m.canary.revision] if m.canary else [])} for name, m in spec.models.items()
    }
    assert revision_slug("v2+fp8~rc1") != "v2+fp8~rc1"  # the plain model's canary needed its slug


def test_services_policies_and_monitors_keep_selecting_both_revisions() -> None:
    kube = canary_kube()
    deps = _vllm_deployments(kube)
    services = {s["metadata"]["name"]: s for s in of_kind(kube, "Service")}
    (monitor,) = [m for m in of_kind(kube, "ServiceMonitor") if m["metadata"]["name"] == "vllm"]
    for model in canary_spec().models:
        service = services[f"vllm-{slug(model)}"]
        assert _selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
        for dep in deps:
            pod = dep["spec"]["template"]["metadata"]["labels"]
            assert _selects(service["spec"]["selector"], pod) == (_model_of(dep) == model), (model, dep)
            if dep["metadata"]["name"].endswith("-canary"):
                assert allowed(kube, pod, VLLM_PORT, PROMETHEUS)
                assert not allowed(kube, pod, VLLM_PORT, STRANGER)
    # One PDB per Deployment, each covering exactly its own Deployment's pods.
    for pdb in of_kind(kube, "PodDisruptionBudget"):
        matched = [
            d["metadata"]["name"]
            for d in of_kind(kube, "Deployment")
            if _selects(pdb["spec"]["selector"]["matchLabels"], d["spec"]["template"]["metadata"]["labels"])
        ]
        assert matched == [pdb["metadata"]["name"]], (pdb["metadata"]["name"], matched)
    pdbs = {p["metadata"]["name"] for p in of_kind(kube, "PodDisruptionBudget")}
    assert {d["metadata"]["name"] for d in deps} <= pdbs


def test_the_canary_render_validates() -> None:
    """The same schema and apiserver checks as the shipped stacks' renders (tests/infra/test_schemas.py)."""
    kube = canary_kube()
    spec = canary_spec()
    schemas.test_core_objects_validate_for_the_stack_version(kube, spec)
    schemas.test_custom_resources_validate_against_the_crds(kube)
    schemas.test_apiserver_rules_no_schema_carries(kube)
    schemas.test_cel_rules_we_rely_on(kube)


def test_a_canary_leaves_the_stable_objects_alone() -> None:
    """Setting (or removing) a canary restarts no stable pod: the stable Deployments, PDBs and
    Services are the objects rendered without it; their ScaledObjects differ in the queries only."""
    prod = load_spec("prod")
    canary = canary_spec()
    kwargs: Obj = {"office_hours": OfficeHours(), "agent_image": "agent", "bucket": "bucket"}
    before = {
        (o["kind"], o["metadata"]["name"]): o for o in serving_objects(prod, plan_fleet(prod), **kwargs)
    }
    after = {
        (o["kind"], o["metadata"]["name"]): o for o in serving_objects(canary, plan_fleet(canary), **kwargs)
    }
    added = set(after) - set(before)
    assert set(before) <= set(after)
    names = {deployment_name(m, Capacity.ON_DEMAND, canary=True) for m in CANARIES}
    assert added == {(k, n) for k in ("Deployment", "PodDisruptionBudget", "ScaledObject") for n in names}
    for key, obj in before.items():
        if key[0] != "ScaledObject":
            assert after[key] == obj, key
            continue
        model_of = obj["spec"]["triggers"][0]["metadata"]["query"]
        if not any(f'"{m}"' in model_of for m in CANARIES):
            assert after[key] == obj, key
            continue
        stripped = copy.deepcopy(after[key])
        for t, old in zip(stripped["spec"]["triggers"], obj["spec"]["triggers"], strict=True):
            if t["type"] == "prometheus":
                t["metadata"]["query"] = re.sub(r',pod!~"[^"]*"', "", t["metadata"]["query"])
            assert t == old, key


def test_the_on_demand_pool_has_room_for_the_canaries() -> None:
    """The canary runs on the on-demand NodePool: its GPU limit grows by the canaries' maxima (each on
    nodes of its own: the smallest size holding one replica, packed), the spot pool's does not."""
    prod, canary = load_spec("prod"), canary_spec()
    before, after = gpu_pool_spec(prod).gpu_limits, gpu_pool_spec(canary).gpu_limits
    plan = plan_fleet(canary)
    sizes = canary.gpu_types["l40s"].gpus_per_instance
    extra = 0
    for model in CANARIES:
        tp = plan.models[model].gpus_per_replica
        size = min(n for n in sizes if n >= tp)
        max_replicas = canary.models[model].canary.max_replicas  # type: ignore[union-attr]
        extra += -(-max_replicas // (size // tp)) * size
    assert extra > 0
    assert after["gpu-l40s"] == before["gpu-l40s"] + extra
    assert after["gpu-l40s-spot"] == before["gpu-l40s-spot"]


@pytest.mark.parametrize(
    "revision",
    ["0e9e39f", "2026-12-01", "v2+fp8~rc1", "2026 12 01", "-x-", "~~~", "a" * 63, "a" * 64, "é" * 128],
)
def test_a_revision_slug_is_a_label_value_and_tells_revisions_apart(revision: str) -> None:
    value = revision_slug(revision)
    assert LABEL_VALUE.fullmatch(value), value
    assert 0 < len(value) <= 63, value
    if LABEL_VALUE.fullmatch(revision) and len(revision) <= 63:
        assert value == revision  # a revision that is a label value is its own slug
    else:
        assert value != revision
        assert revision_slug(revision + "x") != value
    assert revision_slug("2026/12/01") != revision_slug("2026-12-01")


def test_canary_names_fit_kubernetes_limits() -> None:
    longest = "m" * 40  # `slug` refuses longer names
    name = deployment_name(longest, Capacity.ON_DEMAND, canary=True)
    assert name == f"vllm-{longest}-canary"
    assert len(f"keda-hpa-{name}") <= 63  # KEDA's HPA name
    assert len(name) + len("-6b9f7c5d48-x7k2p") <= 253  # the pods' names


def _pods_of(model: str) -> dict[str, Obj]:
    return {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]
        for d in _vllm_deployments(canary_kube())
        if _model_of(d) == model
    }


def test_each_agent_tells_its_revision_through_the_agents_own_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rendered agent args, read by `llmfleet agent`'s parser into the settings it registers with."""
    import argparse

    from apps.agent.cli import configure, settings_from_args

    monkeypatch.setenv("LLMFLEET_NODE_TOKEN", "t" * 32)
    spec = canary_spec()
    for model in CANARIES:
        for name, pod in _pods_of(model).items():
            (agent,) = [c for c in pod["containers"] if c["name"] == "agent"]
            parser = argparse.ArgumentParser()
            configure(parser)
            assert agent["args"][0] == "agent"
            settings = settings_from_args(parser.parse_args(agent["args"][1:]))
            stable, canary = spec.models[model].revision, spec.models[model].canary
            assert canary is not None
            assert settings.model == model
            assert settings.model_revision == (canary.revision if name.endswith("-canary") else stable)


def test_each_pods_model_sync_copies_what_its_vllm_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both revisions published (signed); each pod's rendered model-sync command, run by `llmfleet`,
    leaves exactly the directory its rendered vLLM `--model` names, holding its own revision."""
    from apps.cli.main import main
    from apps.modelsync.publish import publish_model
    from apps.modelsync.s3 import Boto3ObjectStore
    from tests.unit.s3_mock import key_pair, mock_bucket

    model = PLAIN_MODEL
    pods = _pods_of(model)
    (bucket,) = {_arg(p["initContainers"][0]["args"], "--bucket") for p in pods.values()}
    keys = key_pair(tmp_path)
    monkeypatch.setenv("LLMFLEET_MODEL_VERIFY_KEY", str(keys.public))
    with mock_bucket(monkeypatch, bucket) as s3:
        spec = canary_spec().models[model]
        assert spec.canary is not None
        for revision in (spec.revision, spec.canary.revision):
            weights = tmp_path / "weights" / revision
            weights.mkdir(parents=True)
            (weights / "config.json").write_text(f'{{"revision": "{revision}"}}')
            publish_model(Boto3ObjectStore(s3), keys.signer, bucket, model, revision, weights, {})
        for name, pod in pods.items():
            cache_dir = tmp_path / name  # the node's /models
            sync = pod["initContainers"][0]["args"]
            assert sync[0] == "model-sync"
            assert main([cache_dir.as_posix() if a == MODEL_CACHE_MOUNT else a for a in sync]) == 0
            (vllm,) = [c for c in pod["containers"] if c["name"] == "vllm"]
            loads = Path(_arg(vllm["args"], "--model").replace(MODEL_CACHE_MOUNT, cache_dir.as_posix(), 1))
            revision = spec.canary.revision if name.endswith("-canary") else spec.revision
            assert (loads / "config.json").read_text() == f'{{"revision": "{revision}"}}'
            assert sorted(p.name for p in (cache_dir / model).iterdir() if not p.name.startswith(".")) == [
                revision
            ]


@pytest.mark.realvllm
@pytest.mark.timeout(300)
def test_the_canary_vllm_args_parse_with_that_vllm() -> None:
    from tests.infra.test_vllm_args import _parse_with_real_vllm

    containers = [
        c
        for d in _vllm_deployments(canary_kube())
        if d["metadata"]["name"].endswith("-canary")
        for c in d["spec"]["template"]["spec"]["containers"]
        if c["name"] == "vllm"
    ]
    assert len(containers) == len(CANARIES)
    control = ["--model", "/m", "--no-such-flag", "1"]
    result = _parse_with_real_vllm([list(c["args"]) for c in containers] + [control])
    assert result["exit"] == [0] * len(containers) + [2], result
