"""Start and stop an engine server process for the conformance suite.

Free port, readiness poll on `/health`, SIGTERM then SIGKILL of the whole process group at the
end, and the log tail in every failure. The start-up has no fixed wall deadline while the engine
works: a real vLLM takes minutes to start on a loaded 2-core machine, longer the busier the
machine. `wait_ready` fails when the process exits, when it made no progress for `stall_s` (its log
did not grow and its process group used no CPU time), or after `cap_s` in all (a safety net far
above any real start-up).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def log_tail(path: Path, lines: int = 60) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "<no log>"
    return "\n".join(text.splitlines()[-lines:])


class ServerStartError(RuntimeError):
    pass


def group_cpu_s(pgid: int) -> float:
    """CPU time (user + system, seconds) used so far by the live processes of process group `pgid`
    (vLLM runs its engine core in a child process)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rfind(b")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
        if int(fields[2]) == pgid:  # fields: state ppid pgrp session ... utime(11) stime(12)
            total += int(fields[11]) + int(fields[12])
    return total / _TICKS_PER_S


@dataclass(frozen=True)
class Progress:
    """What a start-up has shown so far: its log's size and its CPU time."""

    log_bytes: int
    cpu_s: float


class StartupWatch:
    """Decides, from successive samples, whether a start-up is still going: it is while its
    `Progress` changes at least every `stall_s` and `cap_s` has not passed since `started`."""

    def __init__(self, started: float, stall_s: float, cap_s: float) -> None:
        self.started = started
        self.stall_s = stall_s
        self.cap_s = cap_s
        self._last: Progress | None = None
        self._last_change = started

    def failure(self, now: float, progress: Progress) -> str | None:
        """None while the start-up goes on; else why it is given up."""
        if progress != self._last:
            self._last, self._last_change = progress, now
        if now - self._last_change >= self.stall_s:
            return f"no progress for {now - self._last_change:.0f} s (log and CPU time unchanged)"
        if now - self.started >= self.cap_s:
            return f"still starting after {now - self.started:.0f} s (the cap)"
        return None


@dataclass(frozen=True)
class Clock:
    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


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

    def progress(self) -> Progress:
        assert self.proc is not None
        try:
            size = self.log_path.stat().st_size
        except OSError:
            size = 0
        return Progress(size, group_cpu_s(self.proc.pid))  # its own group: pgid == pid

    def wait_ready(
        self,
        url: str,
        *,
        stall_s: float,
        cap_s: float,
        interval_s: float = 0.25,
        clock: Clock | None = None,
    ) -> float:
        """Poll `url` until 200 (returns the seconds it took); fail with the log tail if the process
        exits, makes no progress for `stall_s`, or is not ready after `cap_s`."""
        clock = clock or Clock()
        watch = StartupWatch(clock.monotonic(), stall_s, cap_s)
        last_error = "no answer yet"
        with httpx.Client(timeout=2.0) as client:
            while True:
                if not self.alive():
                    code = self.proc.returncode if self.proc else None
                    raise ServerStartError(
                        f"{self.name} exited with status {code} during start-up; log tail:\n{log_tail(self.log_path)}"
                    )
                try:
                    if client.get(url).status_code == 200:
                        return clock.monotonic() - watch.started
                    last_error = "not 200"
                except httpx.HTTPError as exc:
                    last_error = repr(exc)
                why = watch.failure(clock.monotonic(), self.progress())
                if why is not None:
                    raise ServerStartError(
                        f"{self.name} not ready at {url}: {why}; last answer: {last_error}; "
                        f"log tail:\n{log_tail(self.log_path)}"
                    )
                clock.sleep(interval_s)  # polling interval of a readiness loop

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
