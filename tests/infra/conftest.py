"""One mocked program run per stack, shared by every infra test (mock runs are slow)."""

from __future__ import annotations

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


def of_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]
