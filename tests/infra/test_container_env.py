"""Every `LLMFLEET_*` name a rendered container sets is a setting of the app that container runs.

Containers run `llmfleet <command>` (their first argument); `apps/cli/settings_registry.py` gives the
command's settings class. A misspelt or foreign name would leave the app at its default silently;
here it fails the render's tests. Secret references into the app Secret name keys it holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from apps.cli.settings_registry import BY_COMMAND
from apps.core.envnames import env_names
from infra.manifests.platform import APP_SECRET, APP_SECRET_FIELDS, app_secret_key
from tests.infra.conftest import kube_objects

Container = dict[str, Any]


def containers(obj: Any) -> Iterator[Container]:
    """Every container and init container anywhere in a manifest (pod templates at any depth)."""
    if isinstance(obj, dict):
        for key in ("containers", "initContainers"):
            if isinstance(obj.get(key), list):
                yield from obj[key]
        for value in obj.values():
            yield from containers(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from containers(value)


def env_problems(container: Container) -> list[str]:
    names = [e["name"] for e in container.get("env", []) if e["name"].startswith("LLMFLEET_")]
    if not names:
        return []
    command = (container.get("args") or ["?"])[0]
    app = BY_COMMAND.get(command)
    if app is None:
        return [f"{container['name']}: sets {names} but runs no known llmfleet command ({command!r})"]
    known = set(env_names(app.settings).values())
    problems = [
        f"{container['name']}: {n} is not a setting of `llmfleet {command}`" for n in names if n not in known
    ]
    secret_keys = {app_secret_key(f) for f in APP_SECRET_FIELDS}
    for e in container.get("env", []):
        ref = e.get("valueFrom", {}).get("secretKeyRef", {})
        if ref.get("name") == APP_SECRET and ref.get("key") not in secret_keys:
            problems.append(f"{container['name']}: the app Secret has no key {ref.get('key')!r}")
    return problems


def test_every_env_name_a_container_sets_is_its_apps_setting(stack: str) -> None:
    seen: dict[str, set[str]] = {}
    problems: list[str] = []
    for obj in kube_objects(stack):
        for c in containers(obj):
            problems += env_problems(c)
            names = {e["name"] for e in c.get("env", []) if e["name"].startswith("LLMFLEET_")}
            if names:
                seen.setdefault(c["name"], set()).update(names)
    assert not problems
    # Not vacuous: the platform's containers are all there, with what they must be told.
    assert {"gateway", "orchestrator", "agent", "migrate", "register-node-pool", "drift"} <= set(seen)
    assert {"LLMFLEET_ORCHESTRATOR_URL", "LLMFLEET_KEEPALIVE_S"} <= seen["gateway"]
    assert "LLMFLEET_NODE_PORT" in seen["orchestrator"]
    assert seen["agent"] == {"LLMFLEET_NODE_TOKEN"}


@pytest.mark.parametrize(
    ("container", "problem"),
    [
        (
            {"name": "gateway", "args": ["gateway"], "env": [{"name": "LLMFLEET_KEEPALIVE", "value": "9"}]},
            "LLMFLEET_KEEPALIVE is not a setting of `llmfleet gateway`",
        ),
        (
            {"name": "agent", "args": ["agent"], "env": [{"name": "LLMFLEET_NODE_PORT", "value": "1"}]},
            "LLMFLEET_NODE_PORT is not a setting of `llmfleet agent`",
        ),
        (
            {"name": "x", "args": ["serve"], "env": [{"name": "LLMFLEET_PORT", "value": "1"}]},
            "runs no known llmfleet command",
        ),
        (
            {
                "name": "drift",
                "args": ["ops"],
                "env": [
                    {
                        "name": "LLMFLEET_DATABASE_URL",
                        "valueFrom": {"secretKeyRef": {"name": APP_SECRET, "key": "LLMFLEET_DATABASE_ULR"}},
                    }
                ],
            },
            "the app Secret has no key",
        ),
    ],
)
def test_a_misspelt_or_foreign_name_is_reported(container: Container, problem: str) -> None:
    (found,) = env_problems(container)
    assert problem in found
