"""Canary by model revision (issue 30 item 3), without I/O: which revisions a request may go to, and
whether a canary broke its bounds.

A model may have two live revisions: its stable one and a canary taking `weight` percent of the
conversations. The split is by conversation, not by request: the key is the team and the
conversation's opening (its messages up to and including the first user message), the same for
every later turn, so a conversation stays on one revision. A request keeps the revisions it was
given for its retries; a resumed stream goes on on the lost node's revision only (`same_revision`).
A rolled-back revision gets nothing: without a canary every request goes to the stable revision.

`CanaryJudge` compares the canary with the stable revision over a sliding window: TTFT p95, output
tokens/s p50, and the ratio of failed attempts. A canary that breaks a bound for `hold_s` in a row
(each revision with at least `min_requests` in the window) is to be rolled back.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

BUCKETS = 10_000  # a weight's resolution: 0.01 %


@dataclass(frozen=True)
class Rollout:
    model: str
    stable: str
    canary: str | None = None
    weight: float = 0.0  # percent of conversations to the canary

    def live(self) -> tuple[str, ...]:
        return (self.stable,) if self.canary is None else (self.stable, self.canary)


def conversation_key(body: Mapping[str, Any], team_id: int, fallback: str) -> bytes:
    """The same for every turn of a conversation of a team: its messages up to the first user one
    (a system prompt alone is shared by many conversations). Without a user message: `fallback`."""
    opening: list[Any] = []
    for message in body.get("messages") or ():
        opening.append(message)
        if isinstance(message, Mapping) and message.get("role") == "user":
            break
    else:
        opening = []
    if not opening:
        return f"{team_id}\x00request\x00{fallback}".encode()
    text = json.dumps(opening, sort_keys=True, separators=(",", ":"), default=str)
    return f"{team_id}\x00conversation\x00{text}".encode()


def bucket(key: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") % BUCKETS


def preferred(rollout: Rollout, key: bytes) -> str:
    """The revision a conversation goes to: the canary for `weight` percent of the keys."""
    if rollout.canary is not None and bucket(key) < round(rollout.weight * BUCKETS / 100):
        return rollout.canary
    return rollout.stable


def allowed(rollout: Rollout | None, key: bytes, serving: Iterable[str]) -> frozenset[str] | None:
    """The revisions a new request may go to (None: any). Its preferred revision while some routable
    node serves it; else the other live revision if one serves it (a canary with no node yet, a stable
    scaled away after a promote); else the stable, waited for. Never a revision not live."""
    if rollout is None:
        return None
    first = preferred(rollout, key)
    present = set(serving)
    if first in present:
        return frozenset({first})
    others = [r for r in rollout.live() if r != first and r in present]
    return frozenset(others[:1] or [rollout.stable])


def same_revision(revision: str | None) -> frozenset[str] | None:
    """A resumed stream: the revision that wrote its first part (None when unknown: any)."""
    return frozenset({revision}) if revision else None


@dataclass(frozen=True)
class Bounds:
    ttft_ratio: float = 1.5  # canary TTFT p95 at most this times the stable's
    tokens_per_s_ratio: float = 0.67  # canary output tokens/s p50 at least this times the stable's
    error_margin: float = 0.02  # canary failed-attempt ratio at most the stable's plus this
    window_s: float = 300.0
    min_requests: int = 20  # per revision in the window before anything is judged
    hold_s: float = 60.0  # a breach this long in a row rolls the canary back


@dataclass(frozen=True)
class Sample:
    at: float
    ttft_s: float | None  # None: no first token (a failed attempt)
    tokens_per_s: float | None
    ok: bool


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass(frozen=True)
class Stats:
    n: int
    ttft_p95: float | None
    tokens_per_s_p50: float | None
    error_ratio: float

    @classmethod
    def of(cls, samples: Iterable[Sample]) -> Stats:
        items = list(samples)
        ttft = [s.ttft_s for s in items if s.ttft_s is not None]
        tps = [s.tokens_per_s for s in items if s.tokens_per_s is not None]
        errors = sum(not s.ok for s in items)
        return cls(
            n=len(items),
            ttft_p95=_quantile(ttft, 0.95) if ttft else None,
            tokens_per_s_p50=_quantile(tps, 0.5) if tps else None,
            error_ratio=errors / len(items) if items else 0.0,
        )


def breach(canary: Stats, stable: Stats, bounds: Bounds) -> str | None:
    """The first bound the canary breaks against the stable revision (None: within them, or too
    few requests of either to say)."""
    if canary.n < bounds.min_requests or stable.n < bounds.min_requests:
        return None
    if canary.error_ratio > stable.error_ratio + bounds.error_margin:
        return f"error ratio {canary.error_ratio:.3f} against {stable.error_ratio:.3f}"
    c_ttft, s_ttft = canary.ttft_p95, stable.ttft_p95
    if c_ttft is not None and s_ttft is not None and c_ttft > bounds.ttft_ratio * s_ttft:
        return f"TTFT p95 {c_ttft:.3f} s against {s_ttft:.3f} s"
    c_tps, s_tps = canary.tokens_per_s_p50, stable.tokens_per_s_p50
    if c_tps is not None and s_tps is not None and c_tps < bounds.tokens_per_s_ratio * s_tps:
        return f"tokens/s p50 {c_tps:.1f} against {s_tps:.1f}"
    return None


class CanaryJudge:
    """One model's canary against its stable revision (samples of this replica's requests)."""

    def __init__(self, rollout: Rollout, bounds: Bounds) -> None:
        self.rollout = rollout
        self.bounds = bounds
        self._samples: dict[str, deque[Sample]] = {r: deque() for r in rollout.live()}
        self._since: float | None = None  # when the current breach started
        self.reason: str | None = None

    def observe(self, revision: str, sample: Sample) -> None:
        if revision in self._samples:
            self._samples[revision].append(sample)

    def stats(self, revision: str, now: float) -> Stats:
        samples = self._samples.get(revision, deque())
        while samples and samples[0].at < now - self.bounds.window_s:
            samples.popleft()
        return Stats.of(samples)

    def verdict(self, now: float) -> str | None:
        """The reason to roll back now (a breach held for `hold_s`), else None."""
        canary = self.rollout.canary
        if canary is None:
            return None
        self.reason = breach(self.stats(canary, now), self.stats(self.rollout.stable, now), self.bounds)
        if self.reason is None:
            self._since = None
            return None
        if self._since is None:
            self._since = now
        return self.reason if now - self._since >= self.bounds.hold_s else None
