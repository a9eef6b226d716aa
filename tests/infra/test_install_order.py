"""What a first `pulumi up` on an empty account relies on (issue 26 items 3, 4, 5, 6, 7, 9).

Class tests over the whole render: admission webhooks against the order releases install in,
account-wide names against a second stack in the same account, and every cluster capability a
rendered object relies on against what the program declares.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.render import config_for, render_program
from tests.infra.conftest import STACKS, depends_closure, rendered

Row = dict[str, Any]
RELEASE = "kubernetes:helm.sh/v3:Release"
WEBHOOKS = json.loads(
    (
        Path(__file__).resolve().parents[1] / "fixtures" / "infra" / "charts" / "admission-webhooks.json"
    ).read_text(encoding="utf-8")
)


def _key(r: Row) -> str:
    return f"{r['type']}::{r['name']}"


def _closure(rows: list[Row], row: Row) -> set[str]:
    return depends_closure(rows, row)


def _value(values: dict[str, Any], dotted: str, default: Any) -> Any:
    node: Any = values
    for part in dotted.split("."):
        if not isinstance(node, dict) or node.get(part) is None:
            return default
        node = node[part]
    return node


def _creators(rows: list[Row], kind: str) -> list[Row]:
    """Rendered objects of `kind`, and every Helm release (each creates the default kinds)."""
    out = [r for r in rows if r["type"].startswith("kubernetes:") and r["inputs"].get("kind") == kind]
    if kind in WEBHOOKS["release_creates"]["default"]:
        out += [r for r in rows if r["type"] == RELEASE]
    return out


@pytest.mark.parametrize("stack", STACKS)
def test_a_webhook_that_fails_closed_is_installed_before_what_it_admits_or_is_off(stack: str) -> None:
    rows = rendered(stack)
    releases = {r["inputs"]["name"]: r for r in rows if r["type"] == RELEASE}
    # A new chart must say which webhooks it registers (an empty list when none).
    assert set(releases) == set(WEBHOOKS["releases"])
    checked = 0
    for name, chart in WEBHOOKS["releases"].items():
        release = releases[name]
        assert release["inputs"]["version"] == chart["chart_version"], f"{name}: facts are for another chart"
        for hook in chart["webhooks"]:
            policy_key = hook.get("failurePolicy_key")
            policy = (_value(release["inputs"]["values"], policy_key, None) if policy_key else None) or hook[
                "failurePolicy"
            ]
            if policy == "Ignore":
                continue
            key = hook["values_key"]
            setting = _value(release["inputs"]["values"], key, None) if key else None
            enabled = (
                hook["default"]
                if setting is None
                else bool(setting) != hook.get("values_key_disables", False)
            )
            if not enabled:
                continue
            for kind in hook["admits"]:
                for creator in _creators(rows, kind):
                    if creator is release:
                        continue
                    checked += 1
                    assert _key(release) in _closure(rows, creator), (
                        f"{_key(creator)} creates {kind}s, which {hook['name']} ({name}) rejects until its "
                        "pods are ready: order it after that release or turn the webhook off"
                    )
    assert checked


# Inputs that name something account- or region-wide (a second stack with the same value collides).
NAME_FIELDS = ("name", "namePrefix", "bucketPrefix", "finalSnapshotIdentifier")
# Names scoped inside another named resource, or AWS-fixed (one per account, by design).
SCOPED = {"aws:eks/addon:Addon", "aws:eks/nodeGroup:NodeGroup", "aws:iam/serviceLinkedRole:ServiceLinkedRole"}


def _account_names(rows: list[Row]) -> dict[str, str]:
    out: dict[str, str] = {}
    for r in rows:
        if not r["type"].startswith(("aws:", "eks:")) or r["type"] in SCOPED:
            continue
        for field in NAME_FIELDS:
            value = r["inputs"].get(field)
            if isinstance(value, str) and value:
                out[f"{_key(r)}.{field}"] = value
    return out


@pytest.mark.parametrize("stack", STACKS)
def test_two_stacks_of_one_spec_in_one_account_share_no_name(stack: str) -> None:
    config = config_for(stack)
    first = _account_names(render_program(stack, dataclasses.replace(config, deployment=f"{stack}-a")).rows)
    second = _account_names(render_program(stack, dataclasses.replace(config, deployment=f"{stack}-b")).rows)
    assert first.keys() == second.keys()
    assert len(first) >= 6, first  # cluster, node role, queue, secrets, repositories, snapshot
    clashes = {k: v for k, v in first.items() if second[k] == v}
    assert not clashes, f"names that do not carry the stack: {clashes}"
    assert all(f"{stack}-a" in v for v in first.values()), first


def _nodepools_use_spot(rows: list[Row]) -> bool:
    for r in rows:
        if r["type"] == "kubernetes:karpenter.sh/v1:NodePool":
            for req in r["inputs"]["spec"]["template"]["spec"]["requirements"]:
                if req["key"] == "karpenter.sh/capacity-type" and "spot" in req.get("values", []):
                    return True
    return False


def _uses_ebs_volumes(rows: list[Row]) -> bool:
    classes = {
        r["inputs"]["metadata"]["name"]: r["inputs"].get("provisioner")
        for r in rows
        if r["inputs"].get("kind") == "StorageClass"
    }
    claims = [
        r["inputs"]["spec"].get("storageClassName")
        for r in rows
        if r["inputs"].get("kind") == "PersistentVolumeClaim"
    ]
    for r in rows:
        if r["type"] == RELEASE:
            text = json.dumps(r["inputs"]["values"])
            claims += [name for name in classes if f'"storageClassName": "{name}"' in text]
    return any(classes.get(c) == "ebs.csi.aws.com" for c in claims)


def _addon(name: str) -> Callable[[list[Row]], bool]:
    return lambda rows: any(
        r["type"] == "aws:eks/addon:Addon" and r["inputs"]["addonName"] == name for r in rows
    )


def _network_policy_enforced(rows: list[Row]) -> bool:
    (cluster,) = [r for r in rows if r["type"] == "eks:index:Cluster"]
    return cluster["inputs"].get("vpcCniOptions", {}).get("enableNetworkPolicy") is True


def _spot_role(rows: list[Row]) -> bool:
    return any(
        r["type"] == "aws:iam/serviceLinkedRole:ServiceLinkedRole"
        and r["inputs"]["awsServiceName"] == "spot.amazonaws.com"
        for r in rows
    )


def _spot_role_before_spot_pools(rows: list[Row]) -> bool:
    """The role exists and every NodePool that may buy spot waits for it."""
    roles = {
        _key(r)
        for r in rows
        if r["type"] == "aws:iam/serviceLinkedRole:ServiceLinkedRole"
        and r["inputs"]["awsServiceName"] == "spot.amazonaws.com"
    }
    spot_pools = [
        r for r in rows if r["type"] == "kubernetes:karpenter.sh/v1:NodePool" and _nodepools_use_spot([r])
    ]
    return bool(roles) and all(roles <= _closure(rows, r) for r in spot_pools)


def _kind(kind: str) -> Callable[[list[Row]], bool]:
    return lambda rows: any(
        r["inputs"].get("kind") == kind for r in rows if r["type"].startswith("kubernetes:")
    )


# (what a rendered object relies on, does the render use it, does the program declare it)
CAPABILITIES: list[tuple[str, Callable[[list[Row]], bool], Callable[[list[Row]], bool]]] = [
    (
        "HPA -> the resource metrics API (metrics-server)",
        _kind("HorizontalPodAutoscaler"),
        _addon("metrics-server"),
    ),
    ("NetworkPolicy -> the VPC CNI's enforcement", _kind("NetworkPolicy"), _network_policy_enforced),
    ("spot NodePool -> the EC2 Spot service-linked role", _nodepools_use_spot, _spot_role_before_spot_pools),
    ("EBS-backed PVC -> the EBS CSI driver", _uses_ebs_volumes, _addon("aws-ebs-csi-driver")),
]


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("capability", CAPABILITIES, ids=[c[0].split(" ->")[0] for c in CAPABILITIES])
def test_every_cluster_capability_a_rendered_object_relies_on_is_declared(
    stack: str, capability: tuple[str, Callable[[list[Row]], bool], Callable[[list[Row]], bool]]
) -> None:
    what, used, declared = capability
    rows = rendered(stack)
    assert used(rows), f"{what}: the stack no longer uses it (drop the row)"
    assert declared(rows), f"{what}: used but not declared by the program"


@pytest.mark.parametrize("stack", STACKS)
def test_releases_outwait_a_first_install_and_nothing_blocks_re_creating_the_stack(stack: str) -> None:
    rows = rendered(stack)
    releases = [r for r in rows if r["type"] == RELEASE]
    assert releases
    for r in releases:
        assert r["inputs"].get("timeout", 300) >= 600, f"{r['name']}: Helm's 300 s default"
    for r in rows:
        if r["type"] == "aws:secretsmanager/secret:Secret":
            assert "name" not in r["inputs"], r["name"]
            assert r["inputs"]["namePrefix"], r["name"]
        if r["inputs"].get("kind") == "StorageClass" and r["type"].startswith("kubernetes:"):
            assert r["inputs"].get("reclaimPolicy", "Delete") == "Delete", r["name"]


def test_an_account_that_has_the_spot_role_declares_it_instead_of_creating_it() -> None:
    """The role is one per account: the second stack in an account says it exists (and `pulumi
    preview` looks it up, failing if it does not); anything else is refused."""
    config = config_for("dev")
    rows = render_program("dev", dataclasses.replace(config, spot_service_linked_role="exists")).rows
    assert _nodepools_use_spot(rows)
    assert not _spot_role(rows)
    with pytest.raises(ValueError, match="must be 'create' or 'exists'"):
        render_program("dev", dataclasses.replace(config, spot_service_linked_role="maybe"))
