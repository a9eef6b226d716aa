"""The pub/sub channel namespace: empty keeps today's channel names (production unchanged); set,
it prefixes every channel, and both apps read it from `LLMFLEET_CHANNEL_NAMESPACE`."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from apps.core.nodes import keys
from apps.gateway.settings import GatewaySettings
from apps.orchestrator.settings import OrchestratorSettings


def test_without_a_namespace_the_channels_keep_their_names() -> None:
    assert keys.node_channel("n1", namespace="") == "nodech:n1"
    assert keys.replica_channel("orch-0", namespace="") == "orch:orch-0"
    assert keys.node_channel_prefix("") == "nodech:"


def test_a_namespace_prefixes_every_channel() -> None:
    assert keys.node_channel("pool/pod-a", namespace="ci-7") == "ci-7:nodech:pool/pod-a"
    assert keys.replica_channel("orch-0", namespace="ci-7") == "ci-7:orch:orch-0"
    assert keys.node_channel("n1", namespace="ci-7").startswith(keys.node_channel_prefix("ci-7"))
    assert not keys.node_channel("n1", namespace="ci-7").startswith(keys.node_channel_prefix(""))


def test_both_apps_read_the_namespace_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMFLEET_CHANNEL_NAMESPACE", "staging-2")
    assert OrchestratorSettings().channel_namespace == "staging-2"
    assert GatewaySettings().channel_namespace == "staging-2"
    monkeypatch.delenv("LLMFLEET_CHANNEL_NAMESPACE")
    assert OrchestratorSettings().channel_namespace == ""
    assert GatewaySettings().channel_namespace == ""


@pytest.mark.parametrize("bad", ["a:b", "has space", "x" * 65, "nodech\n"])
def test_a_namespace_that_would_blur_channel_names_is_refused(bad: str) -> None:
    with pytest.raises(ValidationError):
        OrchestratorSettings(channel_namespace=bad)
    with pytest.raises(ValidationError):
        GatewaySettings(channel_namespace=bad)


def test_this_test_run_talks_in_a_namespace_of_its_own() -> None:
    """`tests/conftest.py` gives the run (and the processes it starts) its `tests/ids.py` namespace."""
    from tests.ids import CHANNEL_NAMESPACE, RUN_ID

    assert RUN_ID in CHANNEL_NAMESPACE
    assert OrchestratorSettings().channel_namespace == CHANNEL_NAMESPACE
    assert GatewaySettings().channel_namespace == CHANNEL_NAMESPACE
