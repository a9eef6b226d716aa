"""What every benchmark shares: starting processes, a throwaway database, CPU of process trees,
percentiles, the event loop, and the machine line each report carries.

Processes start through `apps.cli.procs.Supervisor` (the one `llmfleet dev` uses): own process group,
parent-death signal, readiness poll with a deadline, SIGTERM then SIGKILL.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import platform as pyplatform
import resource
import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path

import psutil

from apps.cli.procs import Child, Supervisor, free_port
from apps.core.db.scratch import scratch_database

__all__ = [
    "DEFAULT_PG",
    "DEFAULT_REDIS",
    "Child",
    "Supervisor",
    "admin_pg_url",
    "free_port",
    "fresh_database",
    "loop_factory",
    "machine",
    "pct",
    "publish",
    "self_cpu_seconds",
    "tree",
    "tree_cpu_seconds",
]

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_REDIS = "redis://127.0.0.1:6379/12"


def admin_pg_url() -> str:
    return os.environ.get("LLMFLEET_DATABASE_URL", DEFAULT_PG)


def fresh_database(admin_url: str, prefix: str = "llmfleet_bench") -> AbstractContextManager[str]:
    """A new, empty database on `admin_url`'s server for the benchmark; dropped (forced) afterwards."""
    return scratch_database(admin_url, prefix)


def module_argv(module: str, *args: str) -> list[str]:
    """A child running one of these tools with this interpreter (the repository root as cwd)."""
    return [sys.executable, "-m", module, *args]


def tree(procs: Sequence[psutil.Process]) -> list[psutil.Process]:
    """The processes and their live descendants (a gateway with `--workers N` serves from children)."""
    out: list[psutil.Process] = []
    for p in procs:
        out.append(p)
        out.extend(p.children(recursive=True))
    return out


def tree_cpu_seconds(procs: Sequence[psutil.Process]) -> float:
    """user + system CPU of the processes, their live descendants and their reaped children."""
    total = 0.0
    for p in tree(procs):
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def self_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def pct(values: Sequence[float], q: float) -> float:
    """The `q` quantile (0..1) by rank, as the gateway and dispatch benchmarks report it."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def loop_factory(name: str = "uvloop") -> Callable[[], asyncio.AbstractEventLoop]:
    if name == "uvloop":
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
        return factory
    return asyncio.new_event_loop


def machine() -> dict[str, str]:
    """Date and machine of a report (docs/performance.md gives both for every number)."""
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": f"{pyplatform.processor() or pyplatform.machine()}, {psutil.cpu_count()} logical CPUs",
        "memory": f"{psutil.virtual_memory().total / 2**30:.1f} GiB",
        "os": f"{pyplatform.system()} {pyplatform.release()}",
        "python": pyplatform.python_version(),
        "load_avg_1m": f"{os.getloadavg()[0]:.2f}",
    }


def publish(text: str, out: Path | None) -> None:
    """A benchmark's page: printed, and also written to `out` when given (`--out FILE`)."""
    if out is not None:
        out.write_text(text)
    print(text)


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]
