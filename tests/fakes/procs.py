"""Stopping the child processes a test started itself (agents, servers): SIGTERM to each, then a
bounded wait, SIGKILL for any that did not exit, and always reaped."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence


def stop_processes(procs: Sequence[subprocess.Popen[bytes]], timeout_s: float) -> None:
    """SIGTERM every process (in the order given), then wait up to `timeout_s` for each; kill and
    reap one that is still running."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
