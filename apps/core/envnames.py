"""The environment names of an app's settings class, read from the class itself.

Every `LLMFLEET_*` name is a field of one settings class (`apps/<app>/settings.py`; the list is
`apps/cli/settings_registry.py`). Whatever writes an environment for an app (infra's manifests,
`llmfleet dev`) spells the name with `env_name(Settings, "field")`, so a typo is an error at render
time instead of a setting silently left at its default; docs/configuration.md is generated from
the same classes (tools/gen_config_docs.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from pydantic_settings import BaseSettings

S = TypeVar("S", bound=BaseSettings)


def env_name(settings: type[BaseSettings], field: str) -> str:
    """The environment variable `settings` reads `field` from (KeyError: no such field)."""
    if field not in settings.model_fields:
        raise KeyError(f"{settings.__name__} has no setting {field!r}")
    return (str(settings.model_config.get("env_prefix", "")) + field).upper()


def env_names(settings: type[BaseSettings]) -> dict[str, str]:
    """Every field of `settings` and its environment name, in the class's order."""
    return {field: env_name(settings, field) for field in settings.model_fields}


def settings_in_env(settings: type[S], env: Mapping[str, str]) -> S:
    """`settings` as a process started with `os.environ` plus `env` would read them (`env` wins;
    its empty values count as unset, names of other apps are ignored)."""
    by_name = {name: field for field, name in env_names(settings).items()}
    given = {by_name[name]: value for name, value in env.items() if name in by_name and value}
    return settings.model_validate(given)  # the rest from the process environment, as in the child


def env_of(settings: type[BaseSettings], **values: str) -> dict[str, str]:
    """An environment setting `values` (field=value) for an app that reads `settings`."""
    return {env_name(settings, field): value for field, value in values.items()}
