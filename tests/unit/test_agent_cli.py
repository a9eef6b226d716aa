"""`llmfleet agent` flags and settings errors (one line, exit 2, no traceback)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from apps.agent.cli import AgentSettingsError, configure, settings_from_args
from apps.cli.main import main
from apps.core.protocol import node as proto
from tests.fakes.engine_sim import engine_sim
from tests.fakes.fake_orchestrator import FakeOrchestrator

BASE = [
    "--orchestrator-url",
    "ws://127.0.0.1:8081/v1/nodes/connect",
    "--node-id",
    "n1",
    "--model",
    "m",
    "--max-num-seqs",
    "8",
]


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure(parser)
    return parser.parse_args(argv)


def test_missing_token_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMFLEET_NODE_TOKEN", raising=False)
    with pytest.raises(AgentSettingsError, match="LLMFLEET_NODE_TOKEN is not set"):
        settings_from_args(_parse(BASE))


def test_flags_become_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMFLEET_NODE_TOKEN", "t")
    s = settings_from_args(
        _parse([*BASE, "--location", "cloud", "--health-port", "9101", "--heartbeat-interval", "2"])
    )
    assert (s.location, s.health_port, s.heartbeat_interval_s, s.max_num_seqs) == ("cloud", 9101, 2.0, 8)
    assert s.engine_url == "http://127.0.0.1:8000"
    assert s.backoff_cap_s == 60.0


def test_bad_url_scheme(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("LLMFLEET_NODE_TOKEN", "t")
    argv = ["agent", *BASE]
    argv[2] = "http://127.0.0.1:8081/v1/nodes/connect"
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("llmfleet agent: error: orchestrator_url")
    assert "ws://" in err
    assert "\n" not in err


def test_no_token_flag_exists() -> None:
    with pytest.raises(SystemExit):
        _parse([*BASE, "--token", "secret"])


@pytest.mark.slow
async def test_cli_process_registers_json_logs_and_drains_on_sigterm(tmp_path: Path) -> None:
    """The real `llmfleet agent` process: token from env only, JSON-lines logs, SIGTERM → exit 0."""
    orch = FakeOrchestrator()
    async with engine_sim() as engine:
        await orch.start()
        env = {**os.environ, "LLMFLEET_NODE_TOKEN": "nt-process"}
        cmd = [
            sys.executable, "-m", "apps.cli.main", "agent",
            "--orchestrator-url", orch.url, "--node-id", "proc-1", "--engine-url", engine.url,
            "--model", engine.model, "--max-num-seqs", "4", "--journal", str(tmp_path / "j.jsonl"),
        ]  # fmt: skip
        proc = await asyncio.create_subprocess_exec(*cmd, env=env, stderr=asyncio.subprocess.PIPE)
        try:
            await orch.wait_for(lambda _: bool(orch.of_type(proto.Heartbeat)), timeout=60)
            assert orch.registrations[0].token == "nt-process"
            assert "nt-process" not in " ".join(cmd)
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(30):
                _, stderr = await proc.communicate()
            assert proc.returncode == 0
            lines = [json.loads(line) for line in stderr.decode().splitlines() if line.strip()]
            assert {"registered", "drained"} <= {entry["msg"] for entry in lines}
            assert orch.of_type(proto.Drained) == [proto.Drained(reason="sigterm")]
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await orch.stop()
