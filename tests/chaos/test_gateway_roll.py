"""Chaos (issue 15 section 1): a rolling restart of the two gateway workers behind one address while
streams run, breaking none.

The local platform runs the gateway as one supervisor with N workers accepting from one listening
socket (`llmfleet gateway --workers N`, `apps/gateway/cli.py`): the local form of replicas behind
one address. The roll: SIGTERM one worker (it stops accepting, finishes its streams, exits), the
supervisor starts a replacement on the same socket, the test waits until the replacement accepts
connections, then the next worker. Meanwhile 20 clients run streams back to back, each on a new
connection, until the roll is over and at least 100 streams ran.

Every stream completes (200, every token, `[DONE]`, no error event) and is billed once; no
connection is refused or reset; both original workers were replaced.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest

from apps.cli.platform import LocalPlatform
from tests.chaos.conftest import PlatformFactory, eight_b_nodes
from tests.chaos.helpers import (
    balance_consistent,
    content_events,
    ledger_totals,
    settled_rows,
    story_body,
    wait_until,
)

pytestmark = pytest.mark.chaos

CLIENTS = 20
AT_LEAST = 100
MAX_TOKENS = 200  # about 2 s at speed 2: a stopping worker always has streams to finish
STARTUP_S = 2.0  # the supervisor's start-up window (a worker dying sooner is a failed start)


def _workers(gateway: psutil.Process) -> set[int]:
    pids = set()
    for p in gateway.children():
        try:
            cmdline = " ".join(p.cmdline())
        except psutil.Error:  # exited (or a zombie) between the listing and the look
            continue
        if "spawn_main" in cmdline and "resource_tracker" not in cmdline:
            pids.add(p.pid)
    return pids


def _accepts(platform: LocalPlatform, pid: int) -> bool:
    """One request on a new connection; True when worker `pid` holds the server side of it."""
    with socket.create_connection(("127.0.0.1", platform.gateway_port), timeout=5) as sock:
        sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: gateway\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        mine = sock.getsockname()
        conns = psutil.Process(pid).net_connections(kind="tcp")
        return any(c.raddr and (c.raddr.ip, c.raddr.port) == mine for c in conns)


class Load:
    def __init__(self, platform: LocalPlatform) -> None:
        assert platform.credentials is not None
        self.url = platform.gateway_url + "/v1/chat/completions"
        self.headers = {"Authorization": f"Bearer {platform.credentials.api_key}"}
        self.rolled = threading.Event()
        self.lock = threading.Lock()
        self.started = 0
        self.ok = 0
        self.broken: list[str] = []
        self.during_roll = 0  # streams started while a worker was stopping

    def client(self) -> None:
        while not (self.rolled.is_set() and self.started >= AT_LEAST):
            with self.lock:
                self.started += 1
            problem = self._one()
            with self.lock:
                if problem is None:
                    self.ok += 1
                else:
                    self.broken.append(problem)

    def _one(self) -> str | None:
        payloads: list[str] = []
        try:
            with httpx.stream(
                "POST", self.url, json=story_body(MAX_TOKENS), headers=self.headers, timeout=60
            ) as resp:
                if resp.status_code != 200:
                    return f"status {resp.status_code}: {resp.read()[:200]!r}"
                payloads = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"
        content = content_events(payloads)
        if payloads[-1:] != ["[DONE]"] or any(p.startswith('{"error"') for p in payloads):
            return f"ended badly: {payloads[-2:]}"
        return None if content == MAX_TOKENS else f"{content} tokens"


def test_rolling_restart_of_two_gateway_workers_during_100_streams_breaks_none(
    make_platform: PlatformFactory, migrated_db_url: str
) -> None:
    platform = make_platform(
        orchestrators=1,
        nodes=eight_b_nodes(2),
        speed=2.0,
        gateway_env={
            "LLMFLEET_PG_POOL_MIN": "1",
            "LLMFLEET_PG_POOL_MAX": "8",
            "LLMFLEET_WORKERS": "2",
            "LLMFLEET_GRACEFUL_SHUTDOWN_S": "60",
            "LLMFLEET_WORKER_STARTUP_S": str(STARTUP_S),
        },
    )
    assert platform.gateway is not None
    gateway = psutil.Process(platform.gateway.pid)
    original = wait_until(lambda: len(w := _workers(gateway)) == 2 and w, 30, "two workers")
    load = Load(platform)
    rolls: list[float] = []
    with ThreadPoolExecutor(CLIENTS) as pool:
        clients = [pool.submit(load.client) for _ in range(CLIENTS)]
        try:
            for pid in sorted(original):
                rolls.append(_roll(platform, gateway, pid, load))
        finally:
            load.rolled.set()
        for c in clients:
            c.result(timeout=180)
    replaced = _workers(gateway)
    print(
        f"\ngateway roll: {load.started} streams, {load.ok} complete, {len(load.broken)} broken; "
        f"{load.during_roll} started while a worker was stopping; each worker replaced and serving "
        f"after {[round(s, 1) for s in rolls]} s"
    )
    assert not load.broken, load.broken[:5]
    assert load.ok == load.started >= AT_LEAST
    assert load.during_roll > 0
    assert len(replaced) == 2
    assert not replaced & original
    rows = wait_until(
        lambda: len(r := [x for x in settled_rows(migrated_db_url) if x[2] == MAX_TOKENS]) >= load.ok and r,
        30,
        "every stream settled",
    )
    assert len(rows) == load.ok  # each billed once
    assert ledger_totals(migrated_db_url).reserved == 0
    balance, expected = balance_consistent(migrated_db_url)
    assert balance == expected


def _roll(platform: LocalPlatform, gateway: psutil.Process, pid: int, load: Load) -> float:
    """SIGTERM worker `pid`; returns the seconds until its replacement accepted a connection."""
    worker = psutil.Process(pid)
    wait_until(lambda: time.time() - worker.create_time() > STARTUP_S + 0.5, 10, "the worker past start-up")
    wait_until(lambda: load.started >= 2 * CLIENTS, 60, "streams running")  # it has some to finish
    known = _workers(gateway)
    before = load.started
    t0 = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: pid not in _workers(gateway), 90, "the worker to finish its streams and exit")
    with load.lock:
        load.during_roll += load.started - before
    (replacement,) = wait_until(lambda: _workers(gateway) - known, 30, "a replacement worker")
    wait_until(
        lambda: _accepts(platform, replacement), 60, "the replacement to accept connections", every_s=0.05
    )
    return time.monotonic() - t0
