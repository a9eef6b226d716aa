"""Container environment entries spelled from the apps' settings classes.

A manifest never writes an `LLMFLEET_*` name as a string: it names a settings class and one of its
fields (`value(GatewaySettings, "keepalive_s", "3605")`), so a misspelt field fails the render
instead of leaving the app at its default. The settings modules import only pydantic and
apps.core (an import-linter contract), which is why infra may import them.
tests/infra/test_container_env.py checks every rendered name against the container's app.
"""

from __future__ import annotations

from pydantic_settings import BaseSettings

from apps.agent.settings import AgentSettings
from apps.cli.settings import AdminSettings
from apps.core.envnames import env_name
from apps.gateway.settings import GatewaySettings
from apps.modelsync.settings import ModelSyncSettings
from apps.ops.settings import OpsSettings
from apps.orchestrator.settings import OrchestratorSettings
from infra.manifests.common import Manifest

__all__ = [
    "AdminSettings",
    "AgentSettings",
    "GatewaySettings",
    "ModelSyncSettings",
    "OpsSettings",
    "OrchestratorSettings",
    "env_name",
    "from_secret",
    "value",
]


def value(settings: type[BaseSettings], field: str, text: str) -> Manifest:
    """`field` of `settings` set to `text`."""
    return {"name": env_name(settings, field), "value": text}


def from_secret(settings: type[BaseSettings], field: str, secret: str, key: str) -> Manifest:
    """`field` of `settings` read from the Secret `secret`'s `key`."""
    return {"name": env_name(settings, field), "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
