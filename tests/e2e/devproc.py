"""Helpers for the tests that run `llmfleet dev` as a user does."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

START_DEADLINE_S = 150.0


def wait_credentials(proc: subprocess.Popen[bytes], path: Path) -> dict[str, str]:
    deadline = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"llmfleet dev exited with {proc.returncode}"
        if path.exists():
            lines = path.read_text().splitlines()
            if len(lines) == 3:
                return dict(line.split("=", 1) for line in lines)
        time.sleep(0.2)
    raise AssertionError("llmfleet dev did not write credentials.env in time")
