"""`llmfleet dev` flags (one line on stderr, exit 2, nothing started) and the gateway roll's refusals
that need no platform: a gateway without its worker supervisor is not signalled at all."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import psutil
import pytest

from apps.cli import dev
from apps.cli.gateway_workers import drain_bound_s, roll_workers, workers
from apps.cli.main import main
from apps.cli.procs import ChildFailed, Supervisor, free_port
from apps.gateway import cli as gateway_cli


def _parse(module: object, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.configure(parser)  # type: ignore[attr-defined]
    return parser.parse_args(argv)


def test_gateway_workers_default_to_one() -> None:
    assert _parse(dev, []).gateway_workers == 1
    assert _parse(dev, ["--gateway-workers", "2"]).gateway_workers == 2


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--gateway-workers", "0"], "--gateway-workers must be between 1 and 64"),
        (["--gateway-workers", "65"], "--gateway-workers must be between 1 and 64"),
        (["--orchestrators", "0"], "--orchestrators must be at least 1"),
    ],
)
def test_bad_counts_are_a_clear_error_and_start_nothing(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "dev"
    assert main(["dev", "--data-dir", str(data_dir), *flags]) == 2
    err = capsys.readouterr().err
    assert err == f"llmfleet dev: {message}\n"
    assert not data_dir.exists()  # nothing started, nothing written


def test_gateway_supervise_flag() -> None:
    assert _parse(gateway_cli, ["--supervise"]).supervise is True
    assert _parse(gateway_cli, []).supervise is False


def test_drain_bound_follows_the_gateways_graceful_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMFLEET_GRACEFUL_SHUTDOWN_S", raising=False)
    assert drain_bound_s({}) == 30 + 10  # GatewaySettings' default + the margin
    assert drain_bound_s({"LLMFLEET_GRACEFUL_SHUTDOWN_S": "60"}) == 70
    monkeypatch.setenv("LLMFLEET_GRACEFUL_SHUTDOWN_S", "5")
    assert drain_bound_s({}) == 15


@pytest.mark.timeout(30)
def test_a_gateway_without_its_supervisor_is_refused_and_left_alone(tmp_path: Path) -> None:
    """One serving process has no worker children: the roll says why it will not restart it, and
    sends nothing (SIGTTIN's default action would have stopped the process)."""
    procs = Supervisor(tmp_path / "logs")
    child = procs.start("gateway", [sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert workers(child.pid) == set()
        with pytest.raises(ChildFailed, match="without its worker supervisor") as caught:
            list(roll_workers(child, free_port(), 5.0, 5.0))
        assert "--gateway-workers" in caught.value.message
        assert child.alive()
        assert psutil.Process(child.pid).status() != psutil.STATUS_STOPPED
    finally:
        procs.stop_all(5.0)
    assert not child.alive()
