"""`llmfleet dev roll orchestrators|gateway --data-dir DIR`: roll the replicas of a running dev
platform one at a time, as a rolling deploy would.

The running `llmfleet dev` writes its pid to `DIR/dev.pid` once it is ready. `roll` writes a
request (`DIR/roll/request.json`, with an id) and sends that process SIGUSR1; `llmfleet dev`
performs the roll in its own loop and writes its progress to `DIR/roll/status.json`. `roll`
follows that file and exits 0 when every replica is back, 1 when the roll failed, 2 when no dev
platform runs there. A rolled child is restarted, never taken for a crash (which stops
`llmfleet dev`).

- Orchestrators: each replica stopped gracefully (SIGTERM, bounded by the platform's stop
  timeout), started again on the same port, and ready again (its `/readyz` and every node `ready`
  in the fleet again) before the next. It breaks no stream: a stopping replica hands its node
  sockets over to the others (`apps/orchestrator/handover.py`; `tests/chaos/test_orchestrator_roll.py`).
- Gateway: its workers, one at a time, surge first — one more worker started on the same
  listening socket and serving, then the oldest retired (it finishes its streams and exits)
  (`apps/cli/gateway_workers.py`; `tests/chaos/test_gateway_roll.py`). The port never refuses a
  connection; the supervisor process itself keeps running.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from apps.cli.gateway_workers import drain_bound_s, roll_workers
from apps.cli.platform import LocalPlatform
from apps.cli.procs import ChildFailed

TARGETS = ("orchestrators", "gateway")
PID_FILE = "dev.pid"


def _roll_dir(data_dir: Path) -> Path:
    return data_dir / "roll"


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    """Atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


# -- the running platform's side -----------------------------------------------------------------


def write_pid(data_dir: Path) -> None:
    (data_dir / PID_FILE).write_text(str(os.getpid()))


def remove_pid(data_dir: Path) -> None:
    (data_dir / PID_FILE).unlink(missing_ok=True)


def serve_request(platform: LocalPlatform) -> None:
    """Perform the pending roll request (called from `llmfleet dev`'s loop after SIGUSR1)."""
    roll_dir = _roll_dir(platform.data_dir)
    request = _read_json(roll_dir / "request.json")
    if request is None:
        return
    rid, target = str(request.get("id", "")), str(request.get("target", ""))
    status = roll_dir / "status.json"
    if (_read_json(status) or {}).get("id") == rid:
        return  # served already
    done: list[str] = []

    def report(state: str, message: str = "") -> None:
        _write_json(status, {"id": rid, "target": target, "state": state, "done": done, "message": message})

    report("running")
    try:
        for name in roll(platform, target):
            done.append(name)
            report("running")
    except Exception as exc:  # the roll failed: say so; `llmfleet dev` keeps running what runs
        report("failed", f"{type(exc).__name__}: {exc}")
        return
    report("done")


def roll(platform: LocalPlatform, target: str) -> Iterator[str]:
    """Roll `target`'s replicas one at a time; yields each replica's name once it is ready again."""
    cfg = platform.config
    node_ids = [n.node_id for n in cfg.nodes]
    if target == "orchestrators":
        for index in range(len(platform.orchestrators)):
            platform.stop_child(platform.orchestrators[index])
            platform.start_orchestrator(index)
            platform.wait_orchestrator(index)
            platform.wait_nodes_ready(node_ids, cfg.ready_timeout_s)  # the agents dialled back in
            yield f"orchestrator-{index}"
    elif target == "gateway":
        if platform.gateway is None or not platform.gateway.alive():
            raise ChildFailed("the gateway is not running")
        yield from roll_workers(
            platform.gateway, platform.gateway_port, cfg.ready_timeout_s, drain_bound_s(cfg.gateway_env)
        )
    else:
        raise ValueError(f"unknown target {target!r} (one of {', '.join(TARGETS)})")


# -- the `llmfleet dev roll` command ---------------------------------------------------------------


def request_roll(data_dir: Path, target: str, timeout_s: float) -> int:
    data_dir = data_dir.resolve()
    try:
        pid = int((data_dir / PID_FILE).read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        print(f"llmfleet dev roll: no running `llmfleet dev` with --data-dir {data_dir}", file=sys.stderr)
        return 2
    rid = uuid.uuid4().hex
    _write_json(_roll_dir(data_dir) / "request.json", {"id": rid, "target": target})
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + timeout_s
    reported: list[str] = []
    while time.monotonic() < deadline:
        status = _read_json(_roll_dir(data_dir) / "status.json") or {}
        if status.get("id") == rid:
            for name in status.get("done", [])[len(reported) :]:
                print(f"rolled {name}: ready again", flush=True)
                reported.append(name)
            if status.get("state") == "done":
                print(f"llmfleet dev roll {target}: every replica is back", flush=True)
                return 0
            if status.get("state") == "failed":
                print(f"llmfleet dev roll {target}: failed: {status.get('message')}", file=sys.stderr)
                return 1
        try:
            os.kill(pid, 0)
        except OSError:
            print("llmfleet dev roll: `llmfleet dev` exited during the roll", file=sys.stderr)
            return 1
        time.sleep(0.2)  # polling the status file the running platform writes (no event to wait on)
    print(f"llmfleet dev roll {target}: not done within {timeout_s:g} s", file=sys.stderr)
    return 1
