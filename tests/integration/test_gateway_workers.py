"""`llmfleet gateway --workers N` as a real process tree: N workers serve one port, a worker
that dies is replaced, SIGTERM stops everything, a start-up failure ends the supervisor."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from apps.cli.procs import free_port
from tests.fakes.procs import stop_processes

pytestmark = pytest.mark.slow  # several Python processes

LLMFLEET = str(Path(sys.executable).with_name("llmfleet"))


def children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(c) for c in (task / "children").read_text().split()}
    return found


def workers(pid: int) -> set[int]:
    """Children running the gateway (spawn's resource tracker is a child too)."""
    out = set()
    for child in children(pid):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"multiprocessing.spawn" in cmdline or b"spawn_main" in cmdline:
            out.add(child)
    return out


def age_s(pid: int) -> float:
    start_ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


async def poll(predicate: object, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()  # type: ignore[operator]
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def livez(port: int) -> bool:
    try:
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/livez") as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


@pytest.fixture
def gateway_env(migrated_db_url: str, redis_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "LLMFLEET_DATABASE_URL": migrated_db_url,
        "LLMFLEET_REDIS_URL": redis_url,
        "LLMFLEET_SECRET_KEY": "workers-test",
        "LLMFLEET_STACK": "dev",
        "LLMFLEET_WORKER_STARTUP_S": "1",
        "LLMFLEET_GRACEFUL_SHUTDOWN_S": "5",
    }


async def test_two_workers_serve_restart_and_stop(gateway_env: dict[str, str]) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [LLMFLEET, "gateway", "--port", str(port), "--workers", "2"],
        env=gateway_env,
        stderr=subprocess.DEVNULL,
    )
    try:
        await poll(lambda: len(workers(proc.pid)) == 2, "two workers")
        await poll(lambda: livez(port), "the port to serve")
        answers = await asyncio.gather(*(livez(port) for _ in range(20)))
        assert all(answers)
        first = workers(proc.pid)
        await poll(lambda: all(age_s(p) > 1.2 for p in first), "workers past start-up")
        victim = min(first)
        os.kill(victim, signal.SIGKILL)
        await poll(lambda: victim not in workers(proc.pid) and len(workers(proc.pid)) == 2, "a replacement")
        assert proc.poll() is None
        await poll(lambda: livez(port), "the port to serve after the restart")
        serving = workers(proc.pid)
        proc.send_signal(signal.SIGTERM)
        await poll(lambda: proc.poll() is not None, "the supervisor to exit", timeout_s=30)
        assert proc.returncode == 0
        assert serving
        assert not any(Path(f"/proc/{p}").exists() for p in serving)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_start_up_failure_ends_the_supervisor(gateway_env: dict[str, str]) -> None:
    env = {**gateway_env, "LLMFLEET_SECRET_KEY": ""}  # build_deps refuses to start without it
    proc = subprocess.Popen(
        [LLMFLEET, "gateway", "--port", str(free_port()), "--workers", "2"],
        env={**env, "LLMFLEET_WORKER_STARTUP_S": "60"},
        stderr=subprocess.DEVNULL,
    )
    try:
        await poll(lambda: proc.poll() is not None, "the supervisor to give up", timeout_s=60)
        assert proc.returncode == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def _status(port: int, path: str) -> int:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}{path}") as r:
        return r.status


@pytest.mark.parametrize("workers_n", [1, 2])
async def test_metrics_are_served_on_the_metrics_port_only(
    gateway_env: dict[str, str], workers_n: int
) -> None:
    """Issue 21: with LLMFLEET_METRICS_PORT the API port no longer serves /metrics (a NetworkPolicy
    lets only Prometheus reach the metrics port); one worker and a supervisor's workers alike."""
    port, metrics_port = free_port(), free_port()
    proc = subprocess.Popen(
        [LLMFLEET, "gateway", "--port", str(port), "--workers", str(workers_n)],
        env={**gateway_env, "LLMFLEET_METRICS_PORT": str(metrics_port)},
        stderr=subprocess.DEVNULL,
    )
    try:
        await poll(lambda: livez(port), "the API port to serve")
        await poll(lambda: livez(metrics_port), "the metrics port to serve")
        assert await _status(metrics_port, "/metrics") == 200
        assert await _status(port, "/metrics") == 404
        assert await _status(port, "/livez") == 200
    finally:
        stop_processes([proc], 30)
