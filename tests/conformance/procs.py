"""Start and stop an engine server process for the conformance suite.

Free port, readiness poll on `/health` with a deadline and a liveness check on every poll,
SIGTERM then SIGKILL of the whole process group at the end, and the log tail in every failure.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx


def log_tail(path: Path, lines: int = 60) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "<no log>"
    return "\n".join(text.splitlines()[-lines:])


class ServerStartError(RuntimeError):
    pass


class ServerProcess:
    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = self.log_path.open("ab")
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,  # its own process group, so we can stop all its children
            )
        finally:
            log.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, url: str, deadline_s: float, interval_s: float = 0.25) -> None:
        """Poll `url` until 200; fail (with the log tail) if the process dies or the deadline passes."""
        end = time.monotonic() + deadline_s
        last_error = "no answer yet"
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < end:
                if not self.alive():
                    code = self.proc.returncode if self.proc else None
                    raise ServerStartError(
                        f"{self.name} exited with status {code} during start-up; log tail:\n{log_tail(self.log_path)}"
                    )
                try:
                    if client.get(url).status_code == 200:
                        return
                    last_error = "not 200"
                except httpx.HTTPError as exc:
                    last_error = repr(exc)
                time.sleep(interval_s)  # polling interval of a readiness loop with a deadline
        raise ServerStartError(
            f"{self.name} not ready at {url} after {deadline_s:.0f} s ({last_error}); "
            f"log tail:\n{log_tail(self.log_path)}"
        )

    def stop(self, grace_s: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = os.getpgid(self.proc.pid)
        os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)  # children that outlived the parent
        if self.proc.poll() is None:
            self.proc.wait(timeout=5)
