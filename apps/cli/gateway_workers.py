"""The gateway's worker processes seen from outside, and their rolling restart with a surge.

`llmfleet gateway --workers N --supervise` is one supervisor process with N spawned workers that
accept from one listening socket (`apps/gateway/cli.py`). `roll_workers` rolls them the way a
Kubernetes RollingUpdate (maxSurge 1, maxUnavailable 0) rolls pods, one at a time: SIGTTIN the
supervisor (one more worker starts on the same socket), wait until that new worker serves (a
`/readyz` 200 on a new connection it accepted itself), then SIGTTOU (the supervisor retires its
oldest worker: it stops accepting, finishes its streams within the gateway's graceful window,
exits and is not replaced) and wait until that worker has exited. At every moment at least N
workers accept and the supervisor holds the listening socket, so the port never refuses a
connection; a one-worker gateway has two for the moment of the surge.

A gateway that serves from one process without the supervisor cannot be rolled without refusing
connections: `roll_workers` says so before it sends anything (SIGTTIN's default action would stop
that process).
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

import psutil

from apps.cli.procs import Child, ChildFailed
from apps.core.envnames import settings_in_env
from apps.gateway.settings import GatewaySettings

T = TypeVar("T")
_POLL_S = 0.05
_DRAIN_MARGIN_S = 10.0  # past the graceful window: the supervisor's own kill comes at +5 s


def workers(supervisor_pid: int) -> set[int]:
    """The pids of the supervisor's live worker processes (its multiprocessing spawns)."""
    try:
        children = psutil.Process(supervisor_pid).children()
    except psutil.Error:
        return set()
    pids = set()
    for child in children:
        try:
            if "--multiprocessing-fork" in child.cmdline():
                pids.add(child.pid)
        except psutil.Error:  # exited (or a zombie) between the listing and the look
            continue
    return pids


def serves(port: int, pid: int) -> bool:
    """One `GET /readyz` on a new connection: True when worker `pid` accepted it and answered 200."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: gateway\r\n\r\n")
            head = sock.recv(65536)
            mine = sock.getsockname()
            conns = psutil.Process(pid).net_connections(kind="tcp")  # while the connection is open
    except (OSError, psutil.Error):
        return False
    accepted = any(c.raddr and (c.raddr.ip, c.raddr.port) == mine for c in conns)
    return accepted and head.startswith(b"HTTP/1.1 200")


def drain_bound_s(gateway_env: Mapping[str, str]) -> float:
    """How long a retired worker may take to finish its streams (the gateway's graceful window)."""
    settings = settings_in_env(GatewaySettings, gateway_env)  # as the gateway process read them
    return float(settings.graceful_shutdown_s) + _DRAIN_MARGIN_S


def roll_workers(gateway: Child, port: int, ready_timeout_s: float, drain_timeout_s: float) -> Iterator[str]:
    """Replace every worker of `gateway`, surge first; yields `gateway-worker-<n>` as each is done."""
    originals = workers(gateway.pid)
    if not originals:
        raise ChildFailed(
            "the gateway serves from one process without its worker supervisor (`llmfleet gateway` "
            "without --workers N or --supervise): restarting it would refuse connections. "
            "`llmfleet dev` supervises its gateway's workers (--gateway-workers N, default 1)"
        )
    for index in range(len(originals)):
        _replace_oldest(gateway, port, ready_timeout_s, drain_timeout_s)
        yield f"gateway-worker-{index}"
    left = originals & workers(gateway.pid)
    if left:
        raise ChildFailed(f"gateway roll: workers {sorted(left)} still run after the roll")


def _replace_oldest(gateway: Child, port: int, ready_timeout_s: float, drain_timeout_s: float) -> None:
    """One more worker, serving; then the oldest retired and gone."""
    before = workers(gateway.pid)
    os.kill(gateway.pid, signal.SIGTTIN)
    new = min(_wait(gateway, lambda: workers(gateway.pid) - before, ready_timeout_s, "new worker"))
    _wait(
        gateway,
        lambda: _serving(gateway, port, new),
        ready_timeout_s,
        f"new worker (pid {new}) serving /readyz",
    )
    os.kill(gateway.pid, signal.SIGTTOU)
    what = "exit of the oldest worker (it finishes its streams first)"
    _wait(gateway, lambda: before - workers(gateway.pid), drain_timeout_s, what)


def _serving(gateway: Child, port: int, pid: int) -> bool:
    if pid not in workers(gateway.pid):
        raise ChildFailed(
            f"gateway roll: the new worker (pid {pid}) exited while starting; log {gateway.log_path}"
        )
    return serves(port, pid)


def _wait(gateway: Child, predicate: Callable[[], T], timeout_s: float, what: str) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        if not gateway.alive():
            raise ChildFailed(
                f"the gateway exited with status {gateway.popen.returncode} while waiting for the {what}; "
                f"log {gateway.log_path}:\n{gateway.log_tail()}"
            )
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise ChildFailed(f"gateway roll: no {what} after {timeout_s:.0f} s; log {gateway.log_path}")
        time.sleep(_POLL_S)  # polling processes and the port: there is no event to wait on
