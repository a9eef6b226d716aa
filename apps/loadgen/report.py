"""Aggregates of a load run and their two renderings: the `--json` document and the table."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from apps.loadgen.client import Outcome, RequestResult
from apps.loadgen.config import LoadConfig


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100) of unsorted values; None when empty."""
    if not values:
        return None
    data = sorted(values)
    pos = (len(data) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 3)


@dataclass
class LoadReport:
    config: LoadConfig
    duration_s: float
    results: list[RequestResult]

    def _ok(self) -> list[RequestResult]:
        return [r for r in self.results if r.outcome is Outcome.OK]

    def per_stream_rates(self) -> list[float]:
        out = []
        for r in self._ok():
            if r.ttft_s is not None and r.output_tokens > 1 and r.e2e_s > r.ttft_s:
                out.append((r.output_tokens - 1) / (r.e2e_s - r.ttft_s))
        return out

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.results if r.outcome is not Outcome.ERROR)

    def to_json(self) -> dict[str, Any]:
        ttfts = [r.ttft_s for r in self.results if r.ttft_s is not None]
        itls = [x for r in self.results for x in r.itls_s]
        e2es = [r.e2e_s for r in self._ok()]
        rates = self.per_stream_rates()
        counts = Counter(r.outcome for r in self.results)
        errors = Counter(r.status for r in self.results if r.outcome is Outcome.ERROR)
        total = len(self.results)
        cfg = self.config
        return {
            "mode": "open" if cfg.rate is not None else "closed",
            "concurrency": cfg.concurrency,
            "rate": cfg.rate,
            "prompt_tokens": cfg.prompt_tokens,
            "max_tokens": cfg.max_tokens,
            "duration_s": round(self.duration_s, 3),
            "requests": {
                "total": total,
                "ok": counts[Outcome.OK],
                "error": counts[Outcome.ERROR],
                "abandoned": counts[Outcome.ABANDONED],
            },
            "errors_by_status": dict(sorted(errors.items())),
            "rate_429": errors["429"] / total if total else 0.0,
            "rate_503": errors["503"] / total if total else 0.0,
            "ttft_ms": {
                "p50": _ms(percentile(ttfts, 50)),
                "p95": _ms(percentile(ttfts, 95)),
                "p99": _ms(percentile(ttfts, 99)),
            },
            "itl_ms": {
                "p50": _ms(percentile(itls, 50)),
                "p95": _ms(percentile(itls, 95)),
                "p99": _ms(percentile(itls, 99)),
            },
            "e2e_ms": {"p50": _ms(percentile(e2es, 50)), "p95": _ms(percentile(e2es, 95))},
            "output_tokens": self.output_tokens,
            "output_tokens_per_s": round(self.output_tokens / self.duration_s, 2)
            if self.duration_s > 0
            else 0.0,
            "output_tokens_per_s_per_stream": {
                "p50": _round(percentile(rates, 50)),
                "mean": _round(sum(rates) / len(rates)) if rates else None,
            },
        }

    def table(self) -> str:
        j = self.to_json()

        def f(v: Any) -> str:
            return "-" if v is None else (f"{v:,.1f}" if isinstance(v, float) else f"{v:,}")

        req = j["requests"]
        rows = [
            (
                "mode",
                f"{j['mode']} loop, concurrency {j['concurrency']}"
                + (f", {j['rate']}/s" if j["rate"] else ""),
            ),
            (
                "requests",
                f"{req['total']} total, {req['ok']} ok, {req['error']} error, {req['abandoned']} abandoned",
            ),
            ("duration", f"{j['duration_s']:.2f} s"),
            (
                "TTFT ms",
                f"p50 {f(j['ttft_ms']['p50'])}  p95 {f(j['ttft_ms']['p95'])}  p99 {f(j['ttft_ms']['p99'])}",
            ),
            ("ITL ms", f"p50 {f(j['itl_ms']['p50'])}  p95 {f(j['itl_ms']['p95'])}"),
            ("E2E ms", f"p50 {f(j['e2e_ms']['p50'])}  p95 {f(j['e2e_ms']['p95'])}"),
            ("output tokens/s", f"{f(j['output_tokens_per_s'])} total ({f(j['output_tokens'])} tokens)"),
            (
                "tokens/s per stream",
                f"p50 {f(j['output_tokens_per_s_per_stream']['p50'])}  mean {f(j['output_tokens_per_s_per_stream']['mean'])}",
            ),
            ("429 / 503 rate", f"{j['rate_429']:.1%} / {j['rate_503']:.1%}"),
            ("errors by status", ", ".join(f"{k}: {v}" for k, v in j["errors_by_status"].items()) or "none"),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 2)
