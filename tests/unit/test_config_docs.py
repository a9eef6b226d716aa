"""docs/configuration.md is the settings classes' own table, and every setting is documented there.

The page is generated (`python -m tools.gen_config_docs`): this test fails when it differs from the
classes in `apps/cli/settings_registry.py`, so a setting added without regenerating fails CI.
"""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from apps.cli.settings_registry import APPS, BY_COMMAND, known_names, shared_names
from apps.core.envnames import env_name, env_names, env_of, settings_in_env
from apps.gateway.settings import GatewaySettings
from apps.orchestrator.settings import OrchestratorSettings
from tools import gen_config_docs


def test_docs_configuration_md_is_generated_from_the_settings_classes() -> None:
    committed = gen_config_docs.DOC.read_text(encoding="utf-8")
    assert committed == gen_config_docs.render(), (
        "docs/configuration.md is stale: run `python -m tools.gen_config_docs` and commit it"
    )
    assert gen_config_docs.main(["--check"]) == 0


def test_every_setting_has_a_one_line_description_and_a_row() -> None:
    page = gen_config_docs.render()
    for app in APPS:
        assert f"## `llmfleet {app.command}`" in page
        for field, name in env_names(app.settings).items():
            description = app.settings.model_fields[field].description
            assert description, f"{app.settings.__name__}.{field} has no description"
            assert "\n" not in description
            assert f"| `{name}` |" in page


def test_a_row_shows_the_env_name_type_default_and_description() -> None:
    page = gen_config_docs.render()
    assert "| `LLMFLEET_KEEPALIVE_S` | integer | `75` | idle keep-alive" in page
    assert "| `LLMFLEET_NODE_TOKEN` | secret | required |" in page  # the agent's: no default
    assert "| `LLMFLEET_LOCATION` | `onprem` or `cloud` | `onprem` |" in page
    assert "| `LLMFLEET_ENGINESIM_FAULTS` | JSON object | `{}` |" in page


def test_names_read_by_several_apps_are_listed_with_each_apps_meaning() -> None:
    shared = dict(shared_names())
    assert [a.command for a in shared["LLMFLEET_PORT"]] == ["gateway", "orchestrator"]
    assert [a.command for a in shared["LLMFLEET_ORCHESTRATOR_URL"]] == ["gateway", "agent"]
    page = gen_config_docs.render()
    section = page.split("## Names read by more than one app")[1].split("## `llmfleet gateway`")[0]
    assert "| `LLMFLEET_PORT` | gateway | `8080` |" in section
    assert "|  | orchestrator | `8081` |" in section


def test_env_name_is_the_prefix_and_the_field_and_refuses_an_unknown_field() -> None:
    assert env_name(GatewaySettings, "keepalive_s") == "LLMFLEET_KEEPALIVE_S"
    assert env_name(BY_COMMAND["enginesim"].settings, "port") == "LLMFLEET_ENGINESIM_PORT"
    with pytest.raises(KeyError, match="keepalive"):
        env_name(GatewaySettings, "keepalive")
    assert env_of(OrchestratorSettings, node_port="8082") == {"LLMFLEET_NODE_PORT": "8082"}
    assert "LLMFLEET_SCALE_FROM_ZERO" in known_names()


def test_settings_in_env_reads_the_process_environment_under_the_given_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LLMFLEET_KEEPALIVE_S", "90")
    monkeypatch.setenv("LLMFLEET_GRACEFUL_SHUTDOWN_S", "45")
    settings = settings_in_env(
        GatewaySettings, {"LLMFLEET_GRACEFUL_SHUTDOWN_S": "60", "LLMFLEET_NODE_PORT": "1"}
    )
    assert (settings.graceful_shutdown_s, settings.keepalive_s) == (60, 90)
    orchestrator = settings_in_env(OrchestratorSettings, {"LLMFLEET_SECRET_KEY": "k"})
    assert orchestrator.secret_key == SecretStr("k")
