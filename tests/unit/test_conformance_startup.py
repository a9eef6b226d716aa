"""The conformance suite's engine start-up watch (`tests/conformance/procs.py`): no fixed wall
deadline while the engine makes progress (its log grows or its processes use CPU time); a failure
when it exits, stalls, or passes the cap, always with its log tail.

The watch's decisions are checked on samples; `wait_ready` on real processes
(`tests/fakes/starting_engine.py`) whose start-up the test drives by polling, on a clock that moves
60 s per poll: no test here waits on the machine's speed."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from apps.cli.procs import free_port
from tests.conformance.procs import (
    Clock,
    Progress,
    ServerProcess,
    ServerStartError,
    StartupWatch,
    group_cpu_s,
)

ENGINE = Path(__file__).resolve().parents[1] / "fakes" / "starting_engine.py"


def test_a_start_that_keeps_making_progress_is_never_given_up_before_the_cap() -> None:
    watch = StartupWatch(started=0.0, stall_s=120, cap_s=1800)
    # 20 minutes of a slow start: the log grows now and then, the CPU time all along.
    for t in range(0, 1200, 10):
        assert watch.failure(float(t), Progress(log_bytes=100 * (t // 100), cpu_s=t / 4)) is None
    assert (
        watch.failure(1800.0, Progress(log_bytes=9999, cpu_s=1000)) == "still starting after 1800 s (the cap)"
    )


def test_a_start_with_no_progress_for_the_stall_window_is_given_up() -> None:
    watch = StartupWatch(started=0.0, stall_s=120, cap_s=1800)
    assert watch.failure(0.0, Progress(500, 30.0)) is None
    assert watch.failure(100.0, Progress(800, 31.0)) is None
    assert watch.failure(219.0, Progress(800, 31.0)) is None  # 119 s without progress
    assert watch.failure(220.0, Progress(800, 31.0)) == "no progress for 120 s (log and CPU time unchanged)"


def test_the_cpu_time_alone_is_progress() -> None:
    watch = StartupWatch(started=0.0, stall_s=60, cap_s=1800)
    for t in range(0, 600, 30):  # a silent log (weights loading, KV cache profiling)
        assert watch.failure(float(t), Progress(4096, cpu_s=t / 2)) is None


class _PollClock:
    """60 s pass on every poll's sleep, at once. `exiting`: a process that has begun to exit; it is
    gone once those 60 s have passed (its tear-down takes real time, on a loaded machine more)."""

    def __init__(self, exiting: Callable[[], subprocess.Popen[bytes] | None] = lambda: None) -> None:
        self.now = 0.0
        self.exiting = exiting

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        proc = self.exiting()
        if proc is not None:
            proc.wait(timeout=30)  # real seconds: what the clock's 60 s would certainly have covered
        self.now += 60.0


def _started(tmp_path: Path, mode: str, n: int) -> Iterator[tuple[ServerProcess, str]]:
    port = free_port()
    log = tmp_path / f"{mode}.log"
    proc = ServerProcess(mode, [sys.executable, str(ENGINE), str(port), mode, str(n)], log)
    proc.start()
    try:
        end = time.monotonic() + 30
        while "listening" not in log.read_text():
            assert proc.alive(), log.read_text()
            assert time.monotonic() < end, log.read_text()
            time.sleep(0.02)  # polling its log with a deadline
        yield proc, f"http://127.0.0.1:{port}/health"
    finally:
        proc.stop()


@pytest.fixture
def slow(tmp_path: Path) -> Iterator[tuple[ServerProcess, str]]:
    yield from _started(tmp_path, "slow", 20)


@pytest.fixture
def dies(tmp_path: Path) -> Iterator[tuple[ServerProcess, str]]:
    yield from _started(tmp_path, "dies", 3)


@pytest.fixture
def stalls(tmp_path: Path) -> Iterator[tuple[ServerProcess, str]]:
    yield from _started(tmp_path, "stalls", 3)


def test_an_engine_that_starts_slowly_but_steadily_is_waited_for(slow: tuple[ServerProcess, str]) -> None:
    proc, url = slow
    clock = _PollClock()
    took = proc.wait_ready(url, stall_s=600, cap_s=3600, clock=Clock(clock.monotonic, clock.sleep))
    assert took >= 20 * 60.0  # 20 minutes on its clock: a fixed 300 s deadline gave up at 5
    assert proc.alive()


def test_an_engine_that_dies_fails_at_once_with_its_status_and_log_tail(
    dies: tuple[ServerProcess, str],
) -> None:
    """It prints its fatal error, stops listening and exits a second later (as vLLM tears its workers
    down): the polls in that second are refused, and the failure is the exit, not a stall. (With a
    clock that let 60 s pass while the process was still exiting, the watch called it a stall: seen
    once under load; the engine's one-second tear-down makes it fail every time on the old clock.)"""
    proc, url = dies
    clock = _PollClock(lambda: proc.proc if "fatal" in proc.log_path.read_text() else None)
    with pytest.raises(ServerStartError) as failed:
        proc.wait_ready(url, stall_s=120, cap_s=3600, clock=Clock(clock.monotonic, clock.sleep))
    message = str(failed.value)
    assert "exited with status 3 during start-up" in message
    assert "loading: step 3\nfatal: cannot allocate the KV cache" in message


def test_an_engine_that_stalls_fails_after_the_stall_window_with_its_log_tail(
    stalls: tuple[ServerProcess, str],
) -> None:
    proc, url = stalls
    clock = _PollClock()
    with pytest.raises(ServerStartError) as failed:
        proc.wait_ready(url, stall_s=300, cap_s=3600, clock=Clock(clock.monotonic, clock.sleep))
    message = str(failed.value)
    assert "no progress for 300 s (log and CPU time unchanged)" in message
    assert message.endswith("loading: step 3\nloading weights")
    assert clock.now < 3600  # the stall, not the cap
    assert proc.alive()  # hung, not dead: the fixture's stop() ends it


def test_the_cpu_time_of_the_process_group_is_read(tmp_path: Path) -> None:
    spin = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\nprint('spun', flush=True)\ntime.sleep(3600)"
    with subprocess.Popen(
        [sys.executable, "-c", spin], stdout=subprocess.PIPE, start_new_session=True
    ) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline() == b"spun\n"
            used = group_cpu_s(proc.pid)
            assert used >= 0.3
            assert group_cpu_s(proc.pid) - used < 0.05  # asleep now: no more CPU time
        finally:
            proc.kill()
