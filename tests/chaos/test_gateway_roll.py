"""Chaos (issue 15 section 1): a rolling restart of the gateway's workers behind one address while
streams run, breaking none, driven by `llmfleet dev roll gateway`'s own code (`apps.cli.roll.roll`).

The local platform runs the gateway as one supervisor with N workers accepting from one listening
socket (`llmfleet gateway --workers N --supervise`, `apps/gateway/cli.py`): the local form of
replicas behind one address. The roll (`apps/cli/gateway_workers.py`), per worker: one more worker
started on the same socket (SIGTTIN) and serving `/readyz` on a connection it accepted, then the
oldest retired (SIGTTOU: it stops accepting, finishes its streams, exits). Meanwhile clients run
streams back to back, each on a new connection, until the roll is over.

Two workers, 20 clients, 100+ streams: every stream completes (200, every token, `[DONE]`, no error
event) and is billed once; no connection is refused or reset; streams started while a worker was
stopping; both original workers were replaced, the supervisor was not. One worker: the roll surges
(old and new worker listen at the same moment) and a probe opening a connection every 20 ms is never
refused and always answered 200.
"""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest

from apps.cli.gateway_workers import workers
from apps.cli.platform import LocalPlatform
from apps.cli.roll import roll
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
LONG_TOKENS = 2000  # about 20 s: one stream that spans the whole roll of a one-worker gateway
STARTUP_S = 2.0  # the supervisor's start-up window (a worker dying sooner is a failed start)
SAMPLE_S = 0.02


def _listens(pid: int, port: int) -> bool:
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in conns)


class Watch(threading.Thread):
    """Samples the workers every 20 ms: which run and which hold the listening socket. A worker seen
    listening that runs on without it is stopping (uvicorn closed its server, the streams finish)."""

    def __init__(self, platform: LocalPlatform) -> None:
        super().__init__(daemon=True)
        assert platform.gateway is not None
        self.supervisor = platform.gateway.pid
        self.port = platform.gateway_port
        self.done = threading.Event()
        self.stopping = threading.Event()
        self.samples: list[dict[int, bool]] = []  # pid -> listening

    def run(self) -> None:
        listened: set[int] = set()
        while not self.done.wait(SAMPLE_S):  # sampling, not waiting for anything
            sample = {pid: _listens(pid, self.port) for pid in workers(self.supervisor)}
            listened |= {pid for pid, listening in sample.items() if listening}
            if any(pid in listened and not listening for pid, listening in sample.items()):
                self.stopping.set()
            else:
                self.stopping.clear()
            self.samples.append(sample)


class Load:
    def __init__(self, platform: LocalPlatform, watch: Watch | None, at_least: int) -> None:
        assert platform.credentials is not None
        self.url = platform.gateway_url + "/v1/chat/completions"
        self.headers = {"Authorization": f"Bearer {platform.credentials.api_key}"}
        self.rolled = threading.Event()
        self.lock = threading.Lock()
        self.started = 0
        self.ok = 0
        self.broken: list[str] = []
        self.during_roll = 0  # streams started while a worker was stopping
        self.watch = watch
        self.at_least = at_least

    def client(self) -> None:
        while not (self.rolled.is_set() and self.started >= self.at_least):
            with self.lock:
                self.started += 1
                self.during_roll += self.watch is not None and self.watch.stopping.is_set()
            problem = self._one()
            with self.lock:
                if problem is None:
                    self.ok += 1
                else:
                    self.broken.append(problem)

    def _one(self, max_tokens: int = MAX_TOKENS) -> str | None:
        payloads: list[str] = []
        try:
            with httpx.stream(
                "POST", self.url, json=story_body(max_tokens), headers=self.headers, timeout=60
            ) as resp:
                if resp.status_code != 200:
                    return f"status {resp.status_code}: {resp.read()[:200]!r}"
                payloads = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"
        content = content_events(payloads)
        if payloads[-1:] != ["[DONE]"] or any(p.startswith('{"error"') for p in payloads):
            return f"ended badly: {payloads[-2:]}"
        return None if content == max_tokens else f"{content} tokens"


def _billed_once(db_url: str, load: Load) -> None:
    rows = wait_until(
        lambda: len(r := [x for x in settled_rows(db_url) if x[2] == MAX_TOKENS]) >= load.ok and r,
        30,
        "every stream settled",
    )
    assert len(rows) == load.ok  # each billed once
    assert ledger_totals(db_url).reserved == 0
    balance, expected = balance_consistent(db_url)
    assert balance == expected


def _platform(make_platform: PlatformFactory, workers_n: int) -> tuple[LocalPlatform, int, set[int]]:
    """The platform, its gateway supervisor's pid and its `workers_n` workers' pids."""
    platform = make_platform(
        orchestrators=1,
        nodes=eight_b_nodes(2),
        speed=2.0,
        gateway_workers=workers_n,
        gateway_env={
            "LLMFLEET_PG_POOL_MIN": "1",
            "LLMFLEET_PG_POOL_MAX": "8",
            "LLMFLEET_GRACEFUL_SHUTDOWN_S": "60",
            "LLMFLEET_WORKER_STARTUP_S": str(STARTUP_S),
        },
    )
    assert platform.gateway is not None
    supervisor = platform.gateway.pid
    started = wait_until(lambda: len(w := workers(supervisor)) == workers_n and w, 30, "the workers")
    return platform, supervisor, started


def _roll_under_load(platform: LocalPlatform, clients: int, at_least: int) -> tuple[Load, Watch, list[str]]:
    """`llmfleet dev roll gateway`'s code while `clients` stream back to back; returns what it saw."""
    watch = Watch(platform)
    watch.start()
    load = Load(platform, watch, at_least)
    names: list[str] = []
    try:
        with ThreadPoolExecutor(clients) as pool:
            futures = [pool.submit(load.client) for _ in range(clients)]
            try:
                wait_until(lambda: load.started >= 2 * clients, 60, "streams running")  # some to finish
                names.extend(roll(platform, "gateway"))
            finally:
                load.rolled.set()
            for f in futures:
                f.result(timeout=180)
    finally:
        watch.done.set()
        watch.join(timeout=10)
    return load, watch, names


@pytest.mark.timeout(180)  # the platform, 100+ streams of 2 s and two workers rolled: about 30 s
def test_rolling_restart_of_two_gateway_workers_during_100_streams_breaks_none(
    make_platform: PlatformFactory, migrated_db_url: str
) -> None:
    platform, supervisor, original = _platform(make_platform, 2)
    t0 = time.monotonic()
    load, _, names = _roll_under_load(platform, CLIENTS, AT_LEAST)
    replaced = workers(supervisor)
    print(
        f"\ngateway roll: {load.started} streams, {load.ok} complete, {len(load.broken)} broken; "
        f"{load.during_roll} started while a worker was stopping; roll and load {time.monotonic() - t0:.1f} s"
    )
    assert not load.broken, load.broken[:5]
    assert load.ok == load.started >= AT_LEAST
    assert load.during_roll > 0
    assert names == ["gateway-worker-0", "gateway-worker-1"]
    assert len(replaced) == 2
    assert not replaced & original
    assert platform.gateway is not None
    assert platform.gateway.alive()  # the supervisor itself was not restarted
    _billed_once(migrated_db_url, load)


class Probe(threading.Thread):
    """A new connection every 20 ms, `GET /readyz`: what each attempt got (status line or error)."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.done = threading.Event()
        self.results: list[str] = []

    def run(self) -> None:
        while not self.done.wait(SAMPLE_S):  # a steady probe, not a wait for anything
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
                    sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: gateway\r\n\r\n")
                    answer = sock.recv(65536)
                    status = answer.split(b"\r\n", 1)[0].decode()
                    # Anything but a 200 keeps its body: which refusal it was (stopping, a dependency).
                    self.results.append(status if status.endswith(" 200 OK") else repr(answer[-200:]))
            except OSError as exc:
                self.results.append(type(exc).__name__)


@pytest.mark.timeout(180)  # the platform and a 20 s stream across the roll: about 30 s
def test_rolling_a_one_worker_gateway_surges_and_never_refuses(
    make_platform: PlatformFactory, migrated_db_url: str
) -> None:
    platform, supervisor, (old,) = _platform(make_platform, 1)
    probe = Probe(platform.gateway_port)
    probe.start()
    # A long stream on the only worker before the roll: the old worker drains it while the new one
    # takes every new connection (the short streams' clients end in step, so they would not show it).
    spanning = Load(platform, None, 0)
    with ThreadPoolExecutor(1) as one:
        long_stream = one.submit(spanning._one, LONG_TOKENS)
        try:
            load, watch, names = _roll_under_load(platform, 4, 8)
        finally:
            probe.done.set()
            probe.join(timeout=10)
        assert long_stream.result(timeout=60) is None
    (new,) = workers(supervisor)
    both = [s for s in watch.samples if s.get(old) and any(v for p, v in s.items() if p != old)]
    print(
        f"\none-worker roll: {len(probe.results)} probes, {len(both)} samples with two listening workers, "
        f"{load.during_roll} streams started while the old worker drained"
    )
    assert names == ["gateway-worker-0"]
    assert new != old
    assert both  # the surge: the new worker listened while the old one still did
    assert len(probe.results) > 10
    assert set(probe.results) == {"HTTP/1.1 200 OK"}, sorted(set(probe.results))  # none 503 `stopping`
    assert not load.broken, load.broken[:5]
    assert load.ok == load.started >= 8
    assert load.during_roll > 0  # the old worker drained while new streams went to the new one
    _billed_once(migrated_db_url, load)
    assert [r for r in settled_rows(migrated_db_url) if r[2] == LONG_TOKENS]  # and the long one too
