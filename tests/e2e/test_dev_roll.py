"""`llmfleet dev --orchestrators 2` and `llmfleet dev roll orchestrators|gateway` as a user runs them:
every replica is replaced one at a time (new pids, same ports; for the gateway: both workers of its
default two, under the same supervisor), the rolls exit 0 when all are back,
the platform keeps running (a rolled child is not taken for a crash) and serves the official
`openai` SDK after each roll; SIGTERM still stops it cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import openai
import psutil
import pytest

from apps.cli.gateway_workers import workers
from apps.cli.procs import free_port
from tests.e2e.devproc import wait_credentials

pytestmark = pytest.mark.slow


def _pids(dev_pid: int, prefix: str) -> set[int]:
    """Children of `llmfleet dev` running `llmfleet <prefix>`."""
    out = set()
    for child in psutil.Process(dev_pid).children():
        cmd = child.cmdline()
        if "apps.cli.main" in cmd and cmd[cmd.index("apps.cli.main") + 1] == prefix:
            out.add(child.pid)
    return out


def _answer(creds: dict[str, str]) -> str:
    base, key = creds["OPENAI_BASE_URL"], creds["OPENAI_API_KEY"]
    with openai.OpenAI(base_url=base, api_key=key, max_retries=0) as client:  # closed: no socket left to GC
        out = client.chat.completions.create(
            model="llama-3.1-8b-instruct", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    return out.choices[0].message.content or ""


def _roll(data_dir: Path, target: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "apps.cli.main", "dev", "roll", target, "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_roll_orchestrators_then_gateway(tmp_path: Path, migrated_db_url: str, redis_url: str) -> None:
    data_dir = tmp_path / "dev"
    port = free_port()
    env = {**os.environ, "LLMFLEET_DATABASE_URL": migrated_db_url, "LLMFLEET_REDIS_URL": redis_url}
    argv = [sys.executable, "-m", "apps.cli.main", "dev", "--data-dir", str(data_dir), "--port", str(port)]
    with (tmp_path / "dev.out").open("wb") as out:
        proc = subprocess.Popen(
            [*argv, "--orchestrators", "2", "--gateway-workers", "2", "--speed", "20"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        creds = wait_credentials(proc, data_dir / "credentials.env")
        assert _answer(creds)
        orchestrators = _pids(proc.pid, "orchestrator")
        assert len(orchestrators) == 2
        gateway = _pids(proc.pid, "gateway")

        rolled = _roll(data_dir, "orchestrators")
        assert rolled.returncode == 0, rolled.stderr
        assert rolled.stdout.count("ready again") == 2
        assert proc.poll() is None  # the rolled children were restarted, not reported dead
        now = _pids(proc.pid, "orchestrator")
        assert len(now) == 2
        assert not now & orchestrators
        assert _answer(creds)

        (supervisor,) = gateway
        gateway_workers = workers(supervisor)
        assert len(gateway_workers) == 2  # --gateway-workers 2
        rolled = _roll(data_dir, "gateway")
        assert rolled.returncode == 0, rolled.stderr
        assert "rolled gateway-worker-0: ready again\nrolled gateway-worker-1: ready again\n" in rolled.stdout
        assert proc.poll() is None
        assert _pids(proc.pid, "gateway") == gateway  # the supervisor kept the port all along
        now = workers(supervisor)
        assert len(now) == 2
        assert not now & gateway_workers
        assert _answer(creds)

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert not (data_dir / "dev.pid").exists()
        assert _roll(data_dir, "gateway").returncode == 2  # nothing runs there any more
    finally:
        if proc.poll() is None:
            proc.kill()
