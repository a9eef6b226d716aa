"""Load for the simulator: trace files (JSON lines or CSV) and the built-in profiles.

One row per request: `t` (arrival, seconds from the start), `model`, `team`, `prompt_tokens`,
`max_tokens`, `answer_tokens` (what the model would answer if not cut at `max_tokens`). A bad
line is a `SpecError` naming the file and the line number.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import random
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from apps.core.errors import SpecError

FIELDS = ("t", "model", "team", "prompt_tokens", "max_tokens", "answer_tokens")


@dataclass(frozen=True, slots=True)
class TraceRequest:
    t: float
    model: str
    team: str
    prompt_tokens: int
    max_tokens: int
    answer_tokens: int


def _row(raw: dict[str, object], where: str) -> TraceRequest:
    missing = [f for f in FIELDS if raw.get(f) in (None, "")]
    if missing:
        raise SpecError(f"{where}: missing field(s) {', '.join(missing)}", param="trace")
    try:
        req = TraceRequest(
            t=float(str(raw["t"])),
            model=str(raw["model"]),
            team=str(raw["team"]),
            prompt_tokens=int(str(raw["prompt_tokens"])),
            max_tokens=int(str(raw["max_tokens"])),
            answer_tokens=int(str(raw["answer_tokens"])),
        )
    except ValueError as exc:
        raise SpecError(f"{where}: {exc}", param="trace") from None
    if not math.isfinite(req.t) or req.t < 0:
        raise SpecError(f"{where}: t must be a finite number >= 0", param="trace")
    if min(req.prompt_tokens, req.max_tokens, req.answer_tokens) < 1:
        raise SpecError(f"{where}: token counts must be at least 1", param="trace")
    return req


def parse_trace(text: str, source: str = "<trace>") -> list[TraceRequest]:
    """JSON lines if the first non-blank character is `{`, else CSV with a header row."""
    if text.lstrip().startswith("{"):
        out = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SpecError(f"{source}:{n}: not valid JSON ({exc.msg})", param="trace") from None
            if not isinstance(raw, dict):
                raise SpecError(f"{source}:{n}: a trace line must be a JSON object", param="trace")
            out.append(_row(raw, f"{source}:{n}"))
    else:
        reader = csv.DictReader(io.StringIO(text))
        out = [_row(dict(r), f"{source}:{n}") for n, r in enumerate(reader, 2)]
    return sorted(out, key=lambda r: r.t)


def load_trace(path: str | Path) -> list[TraceRequest]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"{path}: cannot read trace: {exc.strerror}", param="trace") from None
    return parse_trace(text, str(path))


def write_trace(rows: Iterable[TraceRequest], out: io.TextIOBase | io.StringIO) -> None:
    for r in rows:
        out.write(json.dumps(asdict(r)) + "\n")


# -- built-in profiles --------------------------------------------------------------------------

# The brief: 200 concurrent streams with 2k prompts, split 140/50/10.
BRIEF_SPLIT = {"llama-3.1-8b-instruct": 140, "qwen2.5-32b-instruct": 50, "llama-3.3-70b-instruct-fp8": 10}
Shape = Callable[[float], float]  # share of the peak concurrency at time t (seconds)


@dataclass(frozen=True)
class Profile:
    name: str
    duration_s: float
    shape: Shape
    start_weekday: int  # 0 = Monday: where t = 0 falls, for the KEDA cron triggers
    start_hour: float
    prompt_tokens: tuple[int, int]


def _brief_peak(t: float) -> float:
    # 5 minutes quiet, a 10-minute ramp to the peak (a load test's ramp), 30 minutes at it,
    # 5 minutes down, 10 quiet.
    if t < 300:
        return 0.05
    if t < 900:
        return 0.05 + 0.95 * (t - 300) / 600
    if t < 2700:
        return 1.0
    if t < 3000:
        return 1.0 - 0.95 * (t - 2700) / 300
    return 0.05


def _office_day(t: float) -> float:
    hour = t / 3600
    points = [(0, 0.02), (7, 0.02), (8, 0.3), (9, 1.0), (10, 1.0), (11, 0.35), (16.5, 0.35), (18.5, 0.08),
              (20, 0.02), (24, 0.02)]  # fmt: skip
    for (h0, v0), (h1, v1) in itertools.pairwise(points):
        if h0 <= hour < h1:
            return v0 + (v1 - v0) * (hour - h0) / (h1 - h0)
    return points[-1][1]


PROFILES = {
    # Tuesday 10:00 Europe/Berlin: inside office hours, as a load test would run.
    "brief-peak": Profile("brief-peak", 3600.0, _brief_peak, 1, 10.0, (2048, 2048)),
    # Monday 00:00 to 24:00: idle night, a Monday-morning surge to the brief's peak, a working day.
    "office-day": Profile("office-day", 86400.0, _office_day, 0, 0.0, (256, 2048)),
}


def profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise SpecError(
            f"unknown profile {name!r} (known profiles: {', '.join(sorted(PROFILES))})", param="profile"
        ) from None


def generate(
    prof: Profile,
    service_s: dict[str, float],
    seed: int,
    *,
    split: dict[str, int] | None = None,
    mean_answer: int = 400,
    max_tokens: int = 1024,
) -> list[TraceRequest]:
    """Poisson arrivals whose concurrency follows `shape x split` (Little: rate = streams / service time)."""
    rng = random.Random(seed)
    out: list[TraceRequest] = []
    for model, peak in (split or BRIEF_SPLIT).items():
        if model not in service_s:
            continue
        peak_rate = peak / service_s[model]
        t = 0.0
        while True:
            t += rng.expovariate(peak_rate)  # thinning: candidate arrivals at the peak rate
            if t >= prof.duration_s:
                break
            if rng.random() >= prof.shape(t):
                continue
            lo, hi = prof.prompt_tokens
            answer = max(1, round(rng.uniform(0.5, 1.5) * mean_answer))
            out.append(
                TraceRequest(t, model, f"team-{rng.randrange(8)}", rng.randint(lo, hi), max_tokens, answer)
            )
    return sorted(out, key=lambda r: r.t)


def constant(
    model: str, streams: float, service_s: float, duration_s: float, answer: int
) -> list[TraceRequest]:
    """Evenly spaced arrivals of one length: `streams` concurrent streams, no Poisson noise."""
    gap = service_s / streams
    n = int(duration_s / gap)
    return [TraceRequest(i * gap, model, "team-0", 2048, answer, answer) for i in range(n)]
