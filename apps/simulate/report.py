"""The simulator's results: one summary (JSON-ready), a table, and an optional plot."""

from __future__ import annotations

import math
from typing import Any

from apps.simulate.metrics import Recorder


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def summary(rec: Recorder) -> dict[str, Any]:
    spec = rec.world.spec
    price = {name: g.price_per_gpu_hour_usd for name, g in spec.gpu_types.items()}
    gpu_price = max(price.values()) if price else 0.0
    gpu_hours = rec.gpu_hours()
    cost = gpu_hours * gpu_price
    tokens = sum(m.tokens for m in rec.models.values())
    models = {}
    for name, st in rec.models.items():
        peak_ready = max((row["models"][name]["ready"] for row in rec.timeline), default=0)
        peak_desired = max((row["models"][name]["desired"] for row in rec.timeline), default=0)
        models[name] = {
            "requests": st.served + st.rejected + st.refused + st.failed,
            "served": st.served,
            "rejected_503": st.rejected,
            "refused_429": st.refused,
            "failed": st.failed,
            "queue_wait_p50_s": _r(percentile(st.waits, 50)),
            "queue_wait_p95_s": _r(percentile(st.waits, 95)),
            "queue_wait_max_s": _r(max(st.waits, default=0.0)),
            "ttft_p50_s": _r(percentile(st.ttft, 50)),
            "ttft_p95_s": _r(percentile(st.ttft, 95)),
            "tokens_per_s_per_stream_p50": _r(percentile(st.tps, 50), 1),
            "output_tokens": st.tokens,
            "peak_ready_replicas": peak_ready,
            "peak_desired_replicas": peak_desired,
            "first_503_s": _r(st.first_503_s, 1),
            "first_scale_up_ready_s": _r(st.first_scale_up_ready_s, 1),
        }
    return {
        "stack": spec.name,
        "simulated_s": round(rec.end_s, 1),
        "models": models,
        "scale_up_decided_s": {d: round(t, 1) for d, t in sorted(rec.first_scale_up_s.items())},
        "cloud_gpu_hours": round(gpu_hours, 2),
        "peak_cloud_gpus": max((row["cloud_gpus"] for row in rec.timeline), default=0),
        "cloud_cost_usd": round(cost, 2),
        "cost_per_million_output_tokens_usd": round(cost / (tokens / 1e6), 3) if tokens else None,
        "spot_interruptions": rec.interruptions,
    }


COLUMNS = [
    ("requests", "requests"),
    ("rejected_503", "503"),
    ("refused_429", "429"),
    ("failed", "failed"),
    ("queue_wait_p50_s", "wait p50"),
    ("queue_wait_p95_s", "wait p95"),
    ("queue_wait_max_s", "wait max"),
    ("ttft_p50_s", "ttft p50"),
    ("ttft_p95_s", "ttft p95"),
    ("tokens_per_s_per_stream_p50", "tok/s/stream"),
    ("peak_ready_replicas", "peak replicas"),
    ("first_scale_up_ready_s", "1st new ready s"),
]


def table(s: dict[str, Any]) -> str:
    width = max(len(m) for m in s["models"])
    head = f"{'model':<{width}}  " + "  ".join(f"{h:>{max(len(h), 8)}}" for _, h in COLUMNS)
    lines = [head]
    for name, m in s["models"].items():
        cells = "  ".join(f"{'-' if m[k] is None else m[k]!s:>{max(len(h), 8)}}" for k, h in COLUMNS)
        lines.append(f"{name:<{width}}  {cells}")
    lines.append("")
    lines.append(
        f"cloud GPU hours {s['cloud_gpu_hours']}, peak cloud GPUs {s['peak_cloud_gpus']}, "
        f"cost ${s['cloud_cost_usd']}, per million output tokens ${s['cost_per_million_output_tokens_usd']}, "
        f"spot interruptions {s['spot_interruptions']}, simulated {s['simulated_s']} s"
    )
    return "\n".join(lines)


def plot(rec: Recorder, path: str) -> None:
    """Replicas, queue depth and TTFT over time per model (needs the `simulate` extra: matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(rec.models)
    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    t = [row["t"] / 60 for row in rec.timeline]
    for m in models:
        axes[0].step(t, [row["models"][m]["ready"] for row in rec.timeline], where="post", label=f"{m} ready")
        axes[0].step(
            t, [row["models"][m]["desired"] for row in rec.timeline], where="post", ls=":", alpha=0.6
        )
        axes[1].plot(t, [row["models"][m]["queue"] for row in rec.timeline], label=m)
        pts = sorted(rec.models[m].ttft_at)
        if pts:
            axes[2].plot([a / 60 for a, _ in pts], [b for _, b in pts], ".", ms=1.5, label=m, alpha=0.5)
    axes[0].step(
        t, [row["cloud_gpus"] for row in rec.timeline], where="post", color="k", lw=0.8, label="cloud GPUs"
    )
    axes[0].set_ylabel("replicas (solid ready, dotted desired)")
    axes[1].set_ylabel("orchestrator queue")
    axes[2].set_ylabel("TTFT (s)")
    axes[2].set_xlabel("simulated minutes")
    for ax in axes:
        ax.legend(fontsize=7, loc="upper right")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
