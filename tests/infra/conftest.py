"""One mocked program run per stack, shared by every infra test (mock runs are slow)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from apps.core.sizing.plan import FleetPlan, plan_fleet
from apps.core.spec import StackSpec, load_spec
from infra.render import RenderResult, render_program

STACKS = ("dev", "prod")
_CACHE: dict[str, RenderResult] = {}


def program(stack: str) -> RenderResult:
    """The mocked run of one stack, computed once per test session."""
    if stack not in _CACHE:
        _CACHE[stack] = render_program(stack)
    return _CACHE[stack]


def rendered(stack: str) -> list[dict[str, Any]]:
    return program(stack).rows


def kube_objects(stack: str) -> list[dict[str, Any]]:
    return [
        r["inputs"] for r in rendered(stack) if r["type"].startswith("kubernetes:") and "kind" in r["inputs"]
    ]


@pytest.fixture(scope="session", params=STACKS)
def stack(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def resources(stack: str) -> list[dict[str, Any]]:
    return rendered(stack)


@pytest.fixture(scope="session")
def spec(stack: str) -> StackSpec:
    return load_spec(stack)


@pytest.fixture(scope="session")
def plan(spec: StackSpec) -> FleetPlan:
    return plan_fleet(spec)


@pytest.fixture(scope="session")
def kube(resources: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r["inputs"] for r in resources if r["type"].startswith("kubernetes:") and "kind" in r["inputs"]]


def resource_key(row: dict[str, Any]) -> str:
    """A rendered resource's `type::name`, as `dependsOn` names it."""
    return f"{row['type']}::{row['name']}"


def depends_closure(rows: list[dict[str, Any]], row: dict[str, Any]) -> set[str]:
    """Every resource `row` waits for, directly or through others (`dependsOn`, transitively)."""
    by_key = {resource_key(r): r for r in rows}
    seen: set[str] = set()
    todo = list(row["dependsOn"])
    while todo:
        k = todo.pop()
        if k not in seen:
            seen.add(k)
            todo.extend(by_key[k]["dependsOn"] if k in by_key else [])
    return seen


def of_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def pinned_chart_version(release: str) -> str:
    """The version `infra/components/addons.py` pins for one Helm release."""
    with warnings.catch_warnings():  # pulumi_eks warns on import; render_program filters it the same way
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"pulumi_(aws|eks)(\.|$)")
        from infra.components.addons import CHARTS
    return CHARTS[release][3]


def pinned_controller_charts() -> dict[str, str]:
    """The chart versions of the controllers whose upstream IAM policy the program vendors."""
    with warnings.catch_warnings():  # pulumi_eks warns on import; render_program filters it the same way
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"pulumi_(aws|eks)(\.|$)")
        from infra.components.addons import CHARTS
        from infra.components.karpenter import KARPENTER_VERSION
    return {
        "aws-load-balancer-controller": CHARTS["aws-load-balancer-controller"][3],
        "karpenter": KARPENTER_VERSION,
    }


def upstream_controller_policies() -> dict[str, dict[str, Any]]:
    """Upstream's policy for each controller role the program renders, by RolePolicy name
    (placeholders resolved with stand-ins: the comparisons look at actions and scoping only)."""
    from infra.policies import upstream

    pinned = pinned_controller_charts()
    stand_ins = {
        "AWS::Partition": "aws",
        "AWS::Region": "us-east-1",
        "AWS::AccountId": "123456789012",
        "ClusterName": "cluster",
        "KarpenterNodeRole.Arn": "arn:aws:iam::123456789012:role/node",
        "KarpenterInterruptionQueue.Arn": "arn:aws:sqs:us-east-1:123456789012:queue",
    }
    return {
        "addons-lb-controller": upstream.load_balancer_controller(pinned["aws-load-balancer-controller"]),
        "karpenter-controller": upstream.karpenter_controller(pinned["karpenter"], stand_ins),
    }
