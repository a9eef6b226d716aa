"""`llmfleet dev [--data-dir DIR] [--port 8080]`: the whole platform on this machine.

Embedded PostgreSQL and Redis unless `DevSettings` name them (the database and Redis URLs,
docs/configuration.md), migrations, one orchestrator, five enginesim engines with their agents (two 8B
nodes, one of them on premises, one 32B, one 70B, one of the embedding model bge-m3), a gateway on the port, a demo team
with credits and a demo key. Prints `OPENAI_BASE_URL=`, `OPENAI_API_KEY=` and
`LLMFLEET_ADMIN_TOKEN=` (one per line) and writes them to `DIR/credentials.env`, then the console's URL
and one-time sign-in links for the demo team and the admin (`# console...` lines). With
`--prometheus`, also a real Prometheus on loopback scraping every process with the platform's
rules and alerts (`apps.cli.prometheus`), and `PROMETHEUS_URL=`.
`--orchestrators N` runs N orchestrator replicas behind the gateway (the agents spread over them);
`--gateway-workers N` (default 1) runs the gateway as a supervisor with N workers on its port (one
worker: every Prometheus scrape reads the whole gateway; `roll gateway` surges a second one).
Ctrl-C or SIGTERM stops everything in reverse order; a child that dies on its own stops
the rest too (exit 1) rather than leaving a half platform running.

`llmfleet dev roll orchestrators|gateway --data-dir DIR` rolls the replicas of the platform running
on DIR one at a time (`apps/cli/roll.py`): the orchestrators, or the gateway's workers (surge
first: one more worker serving before the oldest is retired); a rolled child is restarted, not
taken for a crash.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from apps.cli import roll
from apps.cli.console_links import console_links
from apps.cli.platform import DEMO_TEAM, LocalPlatform, PlatformConfig
from apps.cli.procs import free_port
from apps.cli.settings import DevSettings
from apps.core.envnames import env_of
from apps.gateway.settings import GatewaySettings

MAX_GATEWAY_WORKERS = 64  # the gateway's own bound (`GatewaySettings.workers`)


class _Interrupted(Exception):
    """A signal arrived while the platform was still starting."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir", type=Path, default=Path(".llmfleet-dev"), help="default ./.llmfleet-dev"
    )
    parser.add_argument("--port", type=int, default=8080, help="gateway port (default 8080)")
    parser.add_argument(
        "--speed", type=float, default=1.0, help="enginesim time scale (default 1: real time)"
    )
    parser.add_argument(
        "--orchestrators", type=int, default=1, help="orchestrator replicas behind the gateway (default 1)"
    )
    parser.add_argument(
        "--gateway-workers",
        type=int,
        default=1,
        help="gateway worker processes on its port, under one supervisor (default 1; rolled one at a time,"
        " surge first, by `llmfleet dev roll gateway`)",
    )
    parser.add_argument(
        "--prometheus",
        action="store_true",
        help="also start a Prometheus (the `prometheus` binary on PATH) scraping every process, with the"
        " platform's rules and alerts; prints PROMETHEUS_URL=",
    )
    sub = parser.add_subparsers(dest="dev_command")
    rolling = sub.add_parser(
        "roll", help="roll the replicas of a running dev platform one at a time (exit 0 when all are back)"
    )
    rolling.add_argument("target", choices=roll.TARGETS)
    # SUPPRESS: a `--data-dir` given before `roll` is not overwritten by this default.
    rolling.add_argument("--data-dir", type=Path, default=argparse.SUPPRESS, help="the running platform's")
    rolling.add_argument("--timeout", type=float, default=600.0, help="seconds (default 600)")


def _write_credentials(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write("\n".join(lines) + "\n")


def _bad_counts(args: argparse.Namespace) -> str | None:
    if args.orchestrators < 1:
        return "--orchestrators must be at least 1"
    if not 1 <= args.gateway_workers <= MAX_GATEWAY_WORKERS:
        return f"--gateway-workers must be between 1 and {MAX_GATEWAY_WORKERS}"
    return None


def _config(args: argparse.Namespace) -> PlatformConfig:
    env = DevSettings()
    return PlatformConfig(
        data_dir=args.data_dir,
        gateway_port=args.port,
        orchestrators=args.orchestrators,
        gateway_workers=args.gateway_workers,
        database_url=env.database_url or None,
        redis_url=env.redis_url or None,
        speed=args.speed,
    )


def run(args: argparse.Namespace) -> int:
    if getattr(args, "dev_command", None) == "roll":
        return roll.request_roll(args.data_dir, args.target, args.timeout)
    problem = _bad_counts(args)
    if problem:
        print(f"llmfleet dev: {problem}", file=sys.stderr)
        return 2
    config = _config(args)
    prometheus_bin = None
    prometheus_port = 0
    if args.prometheus:
        from apps.cli.prometheus import prometheus_binary

        prometheus_bin = prometheus_binary()  # before anything starts: a clear error, exit 2
        # Its port is known before the gateway starts: the console's admin view reads SLOs from it.
        prometheus_port = free_port()
        config.gateway_env.update(
            env_of(GatewaySettings, prometheus_url=f"http://127.0.0.1:{prometheus_port}")
        )
    stop = threading.Event()
    starting = True

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()
        if starting:  # abort the start-up; `start()` stops what it began
            raise _Interrupted(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    roll_requested = threading.Event()
    previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, lambda *_: roll_requested.set())
    platform = LocalPlatform(config)
    try:
        try:
            creds = platform.start()
            lines = creds.env_lines()
            if prometheus_bin is not None:
                from apps.cli.prometheus import LocalPrometheus

                prometheus = LocalPrometheus(platform, port=prometheus_port)
                lines.append(f"PROMETHEUS_URL={prometheus.start()}")
        except _Interrupted:
            return 130
        starting = False
        _write_credentials(platform.data_dir / "credentials.env", lines)
        roll.write_pid(platform.data_dir)
        _announce(platform, lines)
        return _watch(platform, stop, roll_requested)
    finally:
        # No second signal may interrupt the ordered stop; it is bounded by the supervisor.
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        roll.remove_pid(platform.data_dir)
        platform.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _announce(platform: LocalPlatform, lines: list[str]) -> None:
    """The credentials and console links on stdout; where everything runs on stderr."""
    print("\n".join(lines), flush=True)
    links = console_links(platform.gateway_url, platform.issuer, DEMO_TEAM)
    print("\n".join(links.lines(DEMO_TEAM)), flush=True)
    # Where to inject a fault (`POST <engine>/_sim/faults`) and watch the orchestrator's metrics.
    for node_id, engine in platform.engines.items():
        print(f"# engine of {node_id}: {engine.url}", file=sys.stderr, flush=True)
    for i in range(len(platform.orchestrator_ports)):
        print(f"# orchestrator {i}: {platform.orchestrator_url(i)}", file=sys.stderr, flush=True)
    print(
        f"# llmfleet dev: {len(platform.config.nodes)} nodes ready; logs in {platform.supervisor.log_dir}; "
        "Ctrl-C stops everything",
        file=sys.stderr,
        flush=True,
    )


def _watch(platform: LocalPlatform, stop: threading.Event, roll_requested: threading.Event) -> int:
    """Until a signal: 0; a child that died on its own: 1 (with its log's tail). Serves roll requests."""
    # Wake up once a second to notice a child that died on its own, or a roll request.
    while not stop.wait(1.0):
        if roll_requested.is_set():
            roll_requested.clear()
            roll.serve_request(platform)  # the rolled children are replaced, not reported dead
            continue
        dead = [c for c in platform.supervisor.children if not c.alive()]
        if dead:
            child = dead[0]
            print(
                f"llmfleet dev: {child.name} exited with status {child.popen.returncode}; stopping.\n"
                f"{child.log_tail()}",
                file=sys.stderr,
                flush=True,
            )
            return 1
    return 0
