"""The weekly cost review: GPU hours, tokens and cost per million tokens per model, per day.

GPU hours: cloud from the serving pods' `vllm:*` series (scrape targets labelled
`location="cloud"`: the vLLM ServiceMonitor adds the label) times the plan's GPUs per replica;
on premises from the orchestrators' node gauges (registrations kept alive by heartbeats:
nothing scrapes a node behind NAT). Idle GPU hours: GPU hours of replicas with no request
running. Tokens: the ledger's settled completion tokens; the share of prompt tokens the engines found
in their prefix caches (billed at the cached price) beside them. Cost: GPU hours x the stack's price
per GPU-hour (on-premises hours at the same price, as their amortised cost).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections import defaultdict
from dataclasses import dataclass, field

import psycopg

from apps.core.sizing.plan import FleetPlan
from apps.core.spec import StackSpec
from apps.ops.promapi import OpsError, Prometheus, Samples

Day = str  # YYYY-MM-DD


@dataclass
class ModelWeek:
    cloud_gpu_hours: dict[Day, float] = field(default_factory=lambda: defaultdict(float))
    onprem_gpu_hours: dict[Day, float] = field(default_factory=lambda: defaultdict(float))
    idle_gpu_hours: float = 0.0
    empty_queue_hours: float | None = None  # scale-to-zero models only
    tokens: dict[Day, int] = field(default_factory=lambda: defaultdict(int))
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # of prompt_tokens: found in the engines' prefix caches

    @property
    def cached_share(self) -> float | None:
        return self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else None

    @property
    def gpu_hours(self) -> float:
        return sum(self.cloud_gpu_hours.values()) + sum(self.onprem_gpu_hours.values())


@dataclass(frozen=True)
class CostReport:
    week: str
    days: list[Day]
    price_per_gpu_hour: float
    models: dict[str, ModelWeek]

    def cost_per_million(self, model: str) -> float | None:
        m = self.models[model]
        tokens = sum(m.tokens.values())
        return m.gpu_hours * self.price_per_gpu_hour / (tokens / 1e6) if tokens else None

    def rows(self) -> list[list[str]]:
        out = []
        for name, m in sorted(self.models.items()):
            cpm = self.cost_per_million(name)
            out.append(
                [
                    name,
                    f"{sum(m.cloud_gpu_hours.values()):.3f}",
                    f"{sum(m.onprem_gpu_hours.values()):.3f}",
                    f"{m.idle_gpu_hours:.3f}",
                    "" if m.empty_queue_hours is None else f"{m.empty_queue_hours:.3f}",
                    str(sum(m.tokens.values())),
                    "" if m.cached_share is None else f"{m.cached_share:.1%}",
                    f"{m.gpu_hours * self.price_per_gpu_hour:.2f}",
                    "" if cpm is None else f"{cpm:.2f}",
                ]
            )
        return out

    HEADER = (
        "model", "cloud GPU h", "on-prem GPU h", "idle GPU h", "empty-queue h (scale-to-zero)",
        "tokens served", "prompt tokens cached", "cost USD", "USD per million tokens",
    )  # fmt: skip

    def markdown(self) -> str:
        lines = [
            f"# Cost review {self.week} ({self.days[0]} to {self.days[-1]}, UTC)",
            "",
            f"GPU price: {self.price_per_gpu_hour:g} USD per GPU-hour (the stack's).",
            "",
            "| " + " | ".join(self.HEADER) + " |",
            "|" + "---|" * len(self.HEADER),
        ]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows()]
        return "\n".join(lines) + "\n"

    def csv(self) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(["day", "model", "cloud_gpu_hours", "onprem_gpu_hours", "tokens"])
        for name, m in sorted(self.models.items()):
            for day in self.days:
                writer.writerow(
                    [
                        day,
                        name,
                        f"{m.cloud_gpu_hours[day]:.4f}",
                        f"{m.onprem_gpu_hours[day]:.4f}",
                        m.tokens[day],
                    ]
                )
        return buf.getvalue()


def _integrate(
    series: list[tuple[dict[str, str], Samples]], step_s: float, key: str
) -> dict[str, dict[Day, float]]:
    """value x step per sample, in hours, per label value and UTC day."""
    out: dict[str, dict[Day, float]] = defaultdict(lambda: defaultdict(float))
    for labels, samples in series:
        for t, v in samples:
            day = dt.datetime.fromtimestamp(t, dt.UTC).date().isoformat()
            out[labels.get(key, "")][day] += v * step_s / 3600
    return out


def gather(
    prom: Prometheus, database_url: str, spec: StackSpec, plan: FleetPlan, week: str,
    start: dt.datetime, end: dt.datetime, step_s: float,
) -> CostReport:  # fmt: skip
    lo, hi = start.timestamp(), min(end.timestamp(), dt.datetime.now(dt.UTC).timestamp())
    if lo >= hi:
        raise OpsError(f"empty window: week {week} has not started", param="week")
    days = [(start + dt.timedelta(days=i)).date().isoformat() for i in range(7)]
    models = {name: ModelWeek() for name in plan.models}
    replicas = 'count by (model_name) (vllm:num_requests_running{location="cloud"})'
    idle = 'count by (model_name) (vllm:num_requests_running{location="cloud"} == 0)'
    onprem = 'sum by (model) (llmfleet_orchestrator_node_gpus{location="onprem"})'
    cloud_h = _integrate(prom.series_range(replicas, lo, hi, step_s), step_s, "model_name")
    idle_h = _integrate(prom.series_range(idle, lo, hi, step_s), step_s, "model_name")
    onprem_h = _integrate(prom.series_range(onprem, lo, hi, step_s), step_s, "model")
    for name, model in plan.models.items():
        m = models[name]
        for day, h in cloud_h.get(name, {}).items():
            m.cloud_gpu_hours[day] += h * model.gpus_per_replica
        for day, h in onprem_h.get(name, {}).items():
            m.onprem_gpu_hours[day] += h
        m.idle_gpu_hours = sum(idle_h.get(name, {}).values()) * model.gpus_per_replica
        if model.min_replicas == 0:
            expr = (
                f'(count(vllm:num_requests_running{{model_name="{name}"}}) > 0)'
                f' and on() (sum(llmfleet_orchestrator_queue_depth{{model="{name}"}}) == 0)'
            )
            series = prom.series_range(expr, lo, hi, step_s)
            m.empty_queue_hours = sum(len(s) for _, s in series) * step_s / 3600
    _ledger_tokens(database_url, start, end, models)
    if not any(m.gpu_hours or m.tokens for m in models.values()):
        raise OpsError(f"empty window: no GPU hours and no settled tokens in {week}", param="week")
    price = max(spec.gpu_types[m.serving.gpu_type].price_per_gpu_hour_usd for m in spec.models.values())
    return CostReport(week, days, price, models)


def _ledger_tokens(
    database_url: str, start: dt.datetime, end: dt.datetime, models: dict[str, ModelWeek]
) -> None:
    sql = (
        "SELECT model, to_char(finalized_at AT TIME ZONE 'UTC', 'YYYY-MM-DD'), SUM(completion_tokens),"
        " SUM(prompt_tokens), SUM(cached_prompt_tokens)"
        " FROM usage_ledger WHERE status = 'settled' AND finalized_at >= %s AND finalized_at < %s GROUP BY 1, 2"
    )
    try:
        with psycopg.connect(database_url, connect_timeout=10) as conn:
            rows = conn.execute(sql, (start, end)).fetchall()
    except psycopg.Error as exc:
        raise OpsError(
            f"ledger database not reachable: {str(exc).splitlines()[0]}", param="database_url"
        ) from None
    for model, day, tokens, prompt, cached in rows:
        if model in models:
            models[model].tokens[day] += int(tokens)
            models[model].prompt_tokens += int(prompt)
            models[model].cached_prompt_tokens += int(cached)


def chart_png(report: CostReport) -> bytes:
    """GPU hours and tokens per model per day (two panels), as PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    names = sorted(report.models)
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        m = report.models[name]
        xs = [d + i * width for d in range(len(report.days))]
        top.bar(xs, [m.cloud_gpu_hours[d] + m.onprem_gpu_hours[d] for d in report.days], width, label=name)
        bottom.bar(xs, [m.tokens[d] / 1e6 for d in report.days], width, label=name)
    top.set_ylabel("GPU hours")
    bottom.set_ylabel("million tokens")
    bottom.set_xticks(range(len(report.days)), report.days, rotation=30)
    top.legend(fontsize=7)
    top.set_title(f"llmfleet cost review {report.week}")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()
