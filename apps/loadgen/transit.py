"""Per-request transit time: the client's TTFT minus the engine's own TTFT, joined by `user` tag.

A direct-vs-platform difference of TTFT percentiles is dominated by the engine's simulated
batching (~170 ms against a few ms of platform cost), so it is noisy from run to run. Subtracting,
request by request, the engine's TTFT (first content chunk written - request arrived, from its
timing log) from the client's TTFT (first content chunk received - request sent) cancels the
batching time: what is left is the time the request and its first chunk spent in transit
(client, network, and whatever relays sit in between). Every clock is `time.monotonic()`
(CLOCK_MONOTONIC), which is the same clock in every process of one machine.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apps.loadgen.client import Outcome, RequestResult
from apps.loadgen.report import percentile


@dataclass(frozen=True)
class EngineTiming:
    arrived: float  # monotonic s the engine received the request
    first_content: float  # monotonic s it wrote the first content chunk

    @property
    def ttft_s(self) -> float:
        return self.first_content - self.arrived


def parse_timing_lines(lines: Iterable[str]) -> dict[str, EngineTiming]:
    """Tagged lines of an engine timing log, by `user`. Untagged lines are skipped, and so is a
    last line without its newline (still being written). A tag seen twice keeps its last line."""
    out: dict[str, EngineTiming] = {}
    for line in lines:
        if not line.endswith("\n") or not line.strip():
            continue
        row: Any = json.loads(line)
        user = row.get("user")
        if isinstance(user, str):
            out[user] = EngineTiming(float(row["arrived"]), float(row["first_content"]))
    return out


def read_timing_log(path: Path) -> dict[str, EngineTiming]:
    """The engine timing log at `path` (an absent file is an empty log)."""
    if not path.exists():
        return {}
    with path.open(encoding="utf-8") as f:
        return parse_timing_lines(f)


@dataclass(frozen=True)
class TransitStats:
    ok: int  # OK requests of the run
    joined: int  # of those, how many had a timing line (should be all of them)
    transits_s: tuple[float, ...]  # per joined request: client TTFT - engine TTFT

    def p(self, q: float) -> float | None:
        """Percentile q (0..100) of the transit times, in ms; None when nothing was joined."""
        v = percentile(list(self.transits_s), q)
        return None if v is None else v * 1000

    def to_json(self) -> dict[str, Any]:
        p50, p99 = self.p(50), self.p(99)
        return {
            "ok": self.ok,
            "joined": self.joined,
            "p50": None if p50 is None else round(p50, 3),
            "p99": None if p99 is None else round(p99, 3),
        }


def join_transit(results: Iterable[RequestResult], engine: Mapping[str, EngineTiming]) -> TransitStats:
    """Join the OK results of a tagged run with the engine's timings by `user` tag."""
    ok = 0
    transits: list[float] = []
    for r in results:
        if r.outcome is not Outcome.OK:
            continue
        ok += 1
        client = r.client_ttft_s
        timing = engine.get(r.user) if r.user is not None else None
        if client is None or timing is None:
            continue
        transits.append(client - timing.ttft_s)
    return TransitStats(ok=ok, joined=len(transits), transits_s=tuple(transits))


def added(platform: float | None, direct: float | None) -> float | None:
    """platform - direct, None when either side is missing."""
    return None if platform is None or direct is None else platform - direct
