"""`llmfleet gateway [--host H] [--port P] [--workers N]`: settings from `LLMFLEET_*`, served by uvicorn.

One worker (the default): this process serves. N workers: this process binds the listening
socket once and supervises N spawned worker processes that all accept from it, each with its own
`build_deps` + `create_app` (the gateway keeps no state of its own: keys, quotas and money live
in PostgreSQL and Redis), so the relay's chunk rate scales with cores instead of saturating one.
The supervisor forwards SIGTERM/SIGINT to the workers and waits for their graceful shutdown
(bounded), restarts a worker that dies after start-up, and gives up (exit 1) when a worker dies
during start-up (a configuration error would otherwise restart forever).

Rolling the workers without refusing a connection (`llmfleet dev roll gateway`) uses uvicorn's
supervisor signals: SIGTTIN starts one more worker on the same sockets (a surge), SIGTTOU retires
the oldest worker (`RETIRE_SIGNAL` to it), which stops accepting, finishes its streams and exits,
and is not replaced; it stays ready meanwhile, since the others serve the same address.
(uvicorn's own SIGTTOU retires the newest and blocks until it exits; a roll needs the oldest, and
this loop keeps watching the other workers meanwhile.) A SIGTTIN worker that dies during its start-up
is dropped and the others go on serving. `--supervise` runs the supervisor with one worker too, so
even a one-worker gateway can be rolled: one more first, then the old one.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from types import FrameType

import uvicorn

from apps.core.logs import setup_json_logging
from apps.gateway.app import create_app
from apps.gateway.deps import Lifecycle
from apps.gateway.settings import GatewaySettings
from apps.gateway.wiring import build_deps

log = logging.getLogger("llmfleet.gateway.supervisor")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument(
        "--workers", type=int, default=None, help="worker processes sharing the port (default 1)"
    )
    parser.add_argument(
        "--supervise",
        action="store_true",
        help="run the worker supervisor even with one worker (SIGTTIN/SIGTTOU can then roll it)",
    )


def uvicorn_config(app: object, settings: GatewaySettings) -> uvicorn.Config:
    # httptools explicitly (not "auto"): it is a dependency and the h11 fallback costs several times
    # more per chunk. No proxy-header rewriting: the gateway never reads the client address, and the
    # middleware would parse X-Forwarded-For on every request. The loop is ours (`_loop_factory`).
    return uvicorn.Config(
        app,  # type: ignore[arg-type]
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        lifespan="on",
        http="httptools",
        loop="none",
        proxy_headers=False,
        timeout_graceful_shutdown=settings.graceful_shutdown_s,
        timeout_keep_alive=settings.keepalive_s,
    )


def listen_sockets(settings: GatewaySettings) -> list[socket.socket]:
    """The API port and, when set, the metrics port (one server serves both)."""
    socks = [bind_socket(settings.host, settings.port)]
    if settings.metrics_port is not None:
        socks.append(bind_socket(settings.host, settings.metrics_port))
    return socks


async def _serve(settings: GatewaySettings, socks: list[socket.socket] | None) -> None:
    deps = await build_deps(settings)
    app = create_app(settings, deps)
    # What exists now (modules, spec, app, pools) lives as long as the process: freeze it out of the
    # cyclic collector's reach, or every full collection walks ~90k start-up objects (~50 ms on
    # this machine) while every stream's relay waits: a direct p99 cost.
    gc.collect()
    gc.freeze()
    if socks is None and settings.metrics_port is not None:
        socks = listen_sockets(settings)
    server = StoppingServer(uvicorn_config(app, settings), deps.lifecycle)
    server.install_retire_handler()
    await server.serve(sockets=socks)


RETIRE_SIGNAL = signal.SIGUSR1  # the supervisor to one worker of a roll: stop, the address stays ready
# A retire closes the listener at once but tells uvicorn to stop (which closes connections that
# have not sent a request yet) this much later: a client whose connection this worker accepted just
# before the close has that long to send its request (a loaded roll once saw "Server disconnected").
RETIRE_LINGER_S = 1.0


class StoppingServer(uvicorn.Server):
    """uvicorn, which on SIGTERM/SIGINT stops accepting, lets the requests in flight finish within
    `timeout_graceful_shutdown` (then cancels them: their cleanup cancels upstream and settles)
    and exits; this also turns the app not-ready first (`/readyz` 503, new chat requests on
    kept-alive connections refused) for anything that still reaches it.

    `RETIRE_SIGNAL` (a roll retiring this worker while the others serve the same socket) stops it
    the same way but leaves the app ready: the address is not going away, so a connection this
    worker accepted just before it closed its listener is served like any other (a one-worker roll
    once answered such a `/readyz` probe 503), and uvicorn is told to stop `retire_linger_s` after
    the listener closed. A SIGTERM later (the whole gateway stopping) still turns it not-ready and
    stops it at once."""

    def __init__(
        self, config: uvicorn.Config, lifecycle: Lifecycle, retire_linger_s: float = RETIRE_LINGER_S
    ) -> None:
        super().__init__(config)
        self._lifecycle = lifecycle
        self._retire_linger_s = retire_linger_s
        self._exit_requested = False
        self._address_stopping = False

    def install_retire_handler(self) -> None:
        signal.signal(RETIRE_SIGNAL, self.retire)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._address_stopping = True
        self._begin_stop(sig)
        super().handle_exit(sig, frame)

    def retire(self, sig: int, frame: FrameType | None) -> None:
        self._begin_stop(sig)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not serving yet: nothing accepted, nothing to linger for
            super().handle_exit(signal.SIGTERM, frame)
        else:
            loop.call_soon_threadsafe(self._exit_after_linger)

    def _exit_after_linger(self) -> None:
        exit_now = functools.partial(uvicorn.Server.handle_exit, self, signal.SIGTERM, None)
        asyncio.get_running_loop().call_later(self._retire_linger_s, exit_now)

    def _begin_stop(self, sig: int) -> None:
        first, self._exit_requested = not self._exit_requested, True
        if first:
            event = "gateway_stopping" if self._address_stopping else "gateway_worker_retiring"
            log.info(event, extra={"signal": sig, "in_flight": len(self.server_state.tasks)})
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not serving yet
            self._stop_accepting()
        else:
            # Now, not at uvicorn's next tick (up to 0.1 s later): a connection this worker
            # accepted from the shared socket in between would be served here, while the other
            # workers (a roll's surge) could serve it. (`servers` is uvicorn's public attribute.)
            loop.call_soon_threadsafe(self._stop_accepting)

    def _stop_accepting(self) -> None:
        for server in getattr(self, "servers", []):
            server.close()  # idempotent: a SIGTERM after a retire closes nothing twice
        if self._address_stopping:
            self._lifecycle.stopping = True


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed (about half the per-request CPU of the stdlib loop), else the default."""
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def serve_worker(settings: GatewaySettings, socks: list[socket.socket] | None = None) -> None:
    """One serving process: its own deps, app and event loop (also the spawned workers' target)."""
    setup_json_logging()
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(_serve(settings, socks))


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=2048)
    sock.set_inheritable(True)
    return sock


class Supervisor:
    """N spawned workers on inherited listening sockets (the API port, and the metrics port)."""

    def __init__(self, settings: GatewaySettings, socks: list[socket.socket]) -> None:
        self._settings = settings
        self._socks = socks
        self._ctx = multiprocessing.get_context("spawn")
        self._stop = threading.Event()
        self._procs: dict[int, tuple[BaseProcess, float]] = {}
        self._retiring: list[BaseProcess] = []  # SIGTTOU'd: finishing their streams, not replaced
        self._signals: list[int] = []  # SIGTTIN / SIGTTOU, handled by the loop (not in the handler)
        self._surged: set[int] = set()  # slots SIGTTIN started: failing their start-up stops nothing else
        self._next_slot = 0

    def request_stop(self, signum: int = signal.SIGTERM, frame: FrameType | None = None) -> None:
        self._stop.set()

    def request_resize(self, signum: int, frame: FrameType | None = None) -> None:
        self._signals.append(signum)

    def _start(self, slot: int | None = None) -> None:
        if slot is None:
            slot, self._next_slot = self._next_slot, self._next_slot + 1
        proc = self._ctx.Process(
            target=serve_worker, args=(self._settings, self._socks), name=f"gateway-worker-{slot}"
        )
        proc.start()
        self._procs[slot] = (proc, time.monotonic())
        log.info("worker_started", extra={"slot": slot, "pid": proc.pid})

    def _resize(self) -> None:
        while self._signals:
            if self._signals.pop(0) == signal.SIGTTIN:
                self._surged.add(self._next_slot)
                self._start()
            elif len(self._procs) <= 1:
                log.warning("worker_retire_refused", extra={"reason": "the last worker"})
            else:
                slot = min(self._procs, key=lambda s: self._procs[s][1])  # the oldest
                proc, _ = self._procs.pop(slot)
                log.info("worker_retiring", extra={"slot": slot, "pid": proc.pid})
                if proc.pid is not None and proc.is_alive():
                    os.kill(proc.pid, RETIRE_SIGNAL)  # the others serve on: this one stays ready
                self._retiring.append(proc)
        for proc in [p for p in self._retiring if not p.is_alive()]:
            proc.join()  # reaped: no zombie left for the roll to look at
            self._retiring.remove(proc)
            log.info("worker_retired", extra={"pid": proc.pid, "exitcode": proc.exitcode})

    def run(self) -> int:
        code = 0
        try:
            for _ in range(self._settings.workers):
                self._start()
            while not self._stop.is_set():
                # Wakes on a worker's exit; the timeout bounds how late a stop or resize is noticed.
                procs = [p for p, _ in self._procs.values()] + self._retiring
                multiprocessing.connection.wait([p.sentinel for p in procs], timeout=0.5)
                self._resize()
                for slot, (proc, started) in list(self._procs.items()):
                    if proc.is_alive() or self._stop.is_set():
                        continue
                    if time.monotonic() - started < self._settings.worker_startup_s:
                        log.error("worker_failed_start", extra={"slot": slot, "exitcode": proc.exitcode})
                        if slot in self._surged:  # the workers that serve go on; the roll reports it
                            self._procs.pop(slot)
                            continue
                        code = 1
                        self._stop.set()
                        break
                    log.warning("worker_died", extra={"slot": slot, "exitcode": proc.exitcode})
                    self._start(slot)
        finally:
            self._shutdown()
        return code

    def _shutdown(self) -> None:
        # The listening sockets first: while this process holds them the kernel keeps accepting
        # connections into the backlog that no stopping worker will ever take (they would hang).
        for sock in self._socks:
            sock.close()
        procs = [p for p, _ in self._procs.values()] + self._retiring
        for proc in procs:
            if proc.is_alive() and proc.pid is not None:
                os.kill(proc.pid, signal.SIGTERM)
        # Workers finish their streams within the graceful window; a stuck one is killed after it.
        deadline = time.monotonic() + self._settings.graceful_shutdown_s + 5
        for proc in procs:
            proc.join(max(deadline - time.monotonic(), 0))
            if proc.is_alive():
                proc.kill()
                proc.join()


def run(args: argparse.Namespace) -> int:
    overrides = {
        k: v
        for k, v in (("host", args.host), ("port", args.port), ("workers", args.workers))
        if v is not None
    }
    settings = GatewaySettings(**overrides)
    if settings.workers == 1 and not args.supervise:
        serve_worker(settings)
        return 0
    setup_json_logging()
    supervisor = Supervisor(settings, listen_sockets(settings))
    signal.signal(signal.SIGTERM, supervisor.request_stop)
    signal.signal(signal.SIGINT, supervisor.request_stop)
    # Before any worker starts: a roll that sees workers knows these are handled (their default
    # action would stop the whole process).
    signal.signal(signal.SIGTTIN, supervisor.request_resize)
    signal.signal(signal.SIGTTOU, supervisor.request_resize)
    return supervisor.run()
