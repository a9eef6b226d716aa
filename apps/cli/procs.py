"""Child processes of `llmfleet dev` (and of the chaos tests): start, wait until ready,
stop in reverse order, never leave orphans.

Each child gets its own session (so a terminal's Ctrl-C reaches only the supervisor,
which then stops the children in order) and, on Linux, a parent-death signal, so even a
SIGKILLed supervisor leaves no process behind. Output goes to one log file per child.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from apps.core.errors import LlmfleetError

_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class ChildFailed(LlmfleetError):
    status = 500
    type = "server_error"
    code = "child_failed"


@dataclass
class Child:
    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def llmfleet_argv(*args: str) -> list[str]:
    """Run a subcommand with the same interpreter, whether or not the console script is on PATH."""
    return [sys.executable, "-m", "apps.cli.main", *args]


@dataclass
class Supervisor:
    log_dir: Path
    children: list[Child] = field(default_factory=list)

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Child:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        full_env = {**os.environ, **(env or {})}
        with log_path.open("ab") as log:
            popen = subprocess.Popen(  # argv is built by us, never from user text
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=full_env,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # only a prctl between fork and exec
            )
        child = Child(name=name, argv=list(argv), log_path=log_path, popen=popen)
        self.children.append(child)
        return child

    def wait_http_ok(self, child: Child, url: str, timeout_s: float = 60.0) -> None:
        """Poll `url` until it answers 2xx; fail fast (with the log tail) if the child dies."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not child.alive():
                raise ChildFailed(
                    f"{child.name} exited with status {child.popen.returncode} while starting; "
                    f"log {child.log_path}:\n{child.log_tail()}"
                )
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - loopback URL we built
                    if 200 <= resp.status < 300:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        raise ChildFailed(f"{child.name} not ready at {url} after {timeout_s:.0f} s; log {child.log_path}")

    def stop(self, child: Child, timeout_s: float = 15.0) -> int | None:
        """SIGTERM, wait, then SIGKILL the child's whole process group."""
        if child.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGTERM)
            try:
                child.popen.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
                child.popen.wait(timeout=5)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)  # stragglers the child itself started
        return child.popen.returncode

    def stop_all(self, timeout_s: float = 15.0) -> None:
        for child in reversed(self.children):
            self.stop(child, timeout_s)
        self.children.clear()
