"""Every app's settings class, by its `llmfleet` subcommand: the one list of the `LLMFLEET_*` names.

docs/configuration.md is generated from it (tools/gen_config_docs.py; a unit test fails when the
file is stale), and the infra tests check that every name a rendered container sets belongs to the
settings of the command that container runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from pydantic_settings import BaseSettings

from apps.agent.settings import AgentSettings
from apps.cli.settings import AdminSettings, DevSettings
from apps.core.envnames import env_names
from apps.enginesim.settings import EngineSimSettings
from apps.gateway.settings import GatewaySettings
from apps.loadgen.settings import LoadgenSettings
from apps.modelsync.settings import ModelSyncSettings
from apps.ops.settings import OpsSettings
from apps.orchestrator.settings import OrchestratorSettings


@dataclass(frozen=True)
class AppSettings:
    command: str  # `llmfleet <command>`
    module: str  # where the class is defined
    settings: type[BaseSettings]


def _app(command: str, settings: type[BaseSettings]) -> AppSettings:
    return AppSettings(command, settings.__module__, settings)


APPS: tuple[AppSettings, ...] = (
    _app("gateway", GatewaySettings),
    _app("orchestrator", OrchestratorSettings),
    _app("agent", AgentSettings),
    _app("enginesim", EngineSimSettings),
    _app("model-sync", ModelSyncSettings),
    _app("admin", AdminSettings),
    _app("ops", OpsSettings),
    _app("loadgen", LoadgenSettings),
    _app("dev", DevSettings),
)
BY_COMMAND: dict[str, AppSettings] = {app.command: app for app in APPS}


def known_names() -> frozenset[str]:
    """Every environment name some app reads."""
    return frozenset(name for app in APPS for name in env_names(app.settings).values())


def shared_names() -> Iterator[tuple[str, list[AppSettings]]]:
    """The names more than one app reads (each app reads its own value: see docs/configuration.md)."""
    readers: dict[str, list[AppSettings]] = {}
    for app in APPS:
        for name in env_names(app.settings).values():
            readers.setdefault(name, []).append(app)
    for name in sorted(readers):
        if len(readers[name]) > 1:
            yield name, readers[name]
