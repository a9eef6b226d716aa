"""The on-premises systemd unit: `systemd-analyze verify` clean (exit 0 and no warning,
since unknown keys only warn), and its ExecStart flags are ones `llmfleet agent` accepts."""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
from pathlib import Path

from apps.agent.cli import configure, settings_from_args

UNIT = Path(__file__).resolve().parents[2] / "deploy" / "systemd" / "llmfleet-agent.service"
ENV_EXAMPLE = UNIT.with_name("llmfleet-agent.env.example")
BINARY = "/opt/llmfleet/bin/llmfleet"


def test_systemd_analyze_verify_is_clean(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    assert tool, "systemd-analyze missing: apt-get install systemd"
    copy = tmp_path / UNIT.name
    # verify checks that ExecStart is executable: point it at one that exists here.
    copy.write_text(UNIT.read_text().replace(BINARY, "/bin/true"))
    proc = subprocess.run([tool, "verify", str(copy)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == ""


def test_verify_does_catch_mistakes(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    assert tool
    bad = tmp_path / "bad.service"
    bad.write_text(UNIT.read_text().replace(BINARY, "/bin/true").replace("KillMode=mixed", "KillMood=mixed"))
    proc = subprocess.run([tool, "verify", str(bad)], capture_output=True, text=True, timeout=60)
    assert "Unknown key" in proc.stderr  # so the clean run above means something


def _exec_start_words() -> list[str]:
    text = UNIT.read_text().replace("\\\n", " ")
    (line,) = [ln for ln in text.splitlines() if ln.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart="))


def test_exec_start_matches_the_cli_and_the_env_example() -> None:
    words = _exec_start_words()
    assert words[:2] == [BINARY, "agent"]
    env = dict(
        ln.split("=", 1) for ln in ENV_EXAMPLE.read_text().splitlines() if ln and not ln.startswith("#")
    )
    env["STATE_DIRECTORY"] = "/var/lib/llmfleet-agent"
    used = set(re.findall(r"\$\{(\w+)\}", " ".join(words)))
    assert used <= set(env), used - set(env)
    assert "--token" not in " ".join(words)
    assert "LLMFLEET_NODE_TOKEN" in env
    argv = [re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], w) for w in words[2:]]
    parser = argparse.ArgumentParser()
    configure(parser)
    args = parser.parse_args(argv)
    assert args.location == "onprem"
    assert args.drain_timeout_s == 120.0
    assert str(args.journal) == "/var/lib/llmfleet-agent/journal.jsonl"


def test_settings_from_the_unit_need_the_token_from_env(monkeypatch: object) -> None:
    import pytest

    mp = pytest.MonkeyPatch()
    try:
        mp.setenv("LLMFLEET_NODE_TOKEN", "nt-from-env")
        parser = argparse.ArgumentParser()
        configure(parser)
        args = parser.parse_args(
            [
                "--orchestrator-url",
                "wss://o:443/v1/nodes/connect",
                "--node-id",
                "n",
                "--model",
                "m",
                "--max-num-seqs",
                "4",
            ]
        )
        settings = settings_from_args(args)
        assert settings.node_token.get_secret_value() == "nt-from-env"
        assert "nt-from-env" not in repr(settings)
    finally:
        mp.undo()
