"""Render a `FleetPlan` as the planner's human-readable table."""

from __future__ import annotations

from apps.core.sizing.kv import KIB
from apps.core.sizing.plan import FleetPlan, ModelPlan


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(
        h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths, strict=True))
    )
    out = [line, "  ".join("-" * w for w in widths)]
    for row in rows:
        out.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    return out


def render_plan(plan: FleetPlan) -> str:
    sections = [
        table
        for table in (
            _capacity_table(plan),
            _economics_table(plan),
            _embedding_capacity_table(plan),
            _embedding_economics_table(plan),
        )
        if table
    ]
    fleet = [
        f"GPUs at peak: {plan.gpus_peak}  (on premises {plan.gpus_onprem}, cloud {plan.gpus_cloud})",
        f"cost at peak: {plan.cost_per_hour_peak_usd:,.2f} USD/hour (cloud GPUs only)",
        f"cost per month: {plan.cost_per_month_usd:,.0f} USD "
        f"at an average of {plan.average_cloud_gpus:g} cloud GPUs",
    ]
    warnings = [f"warning: {w}" for w in plan.warnings]
    body = [line for table in sections for line in (*table, "")]
    return "\n".join([f"capacity plan: stack {plan.stack}", "", *body, *fleet, *warnings])


def _generate(plan: FleetPlan) -> list[ModelPlan]:
    return [m for m in plan.models.values() if m.task != "embed"]


def _embedding(plan: FleetPlan) -> list[ModelPlan]:
    return [m for m in plan.models.values() if m.task == "embed"]


def _capacity_table(plan: FleetPlan) -> list[str]:
    """Per generate model: the KV cache's fit, the streams per replica and the replicas at peak."""
    models = _generate(plan)
    if not models:
        return []
    return _table(
        [
            "model",
            "KV/token",
            "GPUs/repl",
            "KV/replica",
            "context",
            "fit",
            "target",
            "max-num-seqs",
            "peak",
            "replicas",
            "bounds",
            "GPUs",
        ],
        [
            [
                m.name,
                f"{m.kv_bytes_per_token / KIB:.0f} KiB",
                str(m.gpus_per_replica),
                f"{m.kv_budget_gib_per_replica:.1f} GiB",
                f"{m.planning_context_tokens:,}",
                str(m.streams_per_replica),
                str(m.streams_target),
                str(m.max_num_seqs),
                str(m.peak_streams),
                str(m.replicas),
                f"{m.min_replicas}..{m.max_replicas}",
                str(m.gpus),
            ]
            for m in models
        ],
    )


def _economics_table(plan: FleetPlan) -> list[str]:
    """Per generate model: throughput, cost per million tokens and the queueing figures."""
    models = _generate(plan)
    if not models:
        return []
    return _table(
        [
            "model",
            "tok/s/replica",
            "tok/s/stream",
            "USD/M full",
            "USD/M 50%",
            "s/answer",
            "req/s/replica",
            f"burst in {plan.queue_limit_s:.0f} s",
            "prefix hits",
            "credits/M prompt",
        ],
        [
            [
                m.name,
                f"{m.output_tokens_per_s_per_replica:,.0f}",
                f"{m.tokens_per_s_per_stream:.1f}",
                f"{m.cost_per_million_tokens_usd['full']:.2f}",
                f"{m.cost_per_million_tokens_usd['half']:.2f}",
                f"{m.queue.service_time_s:.1f}",
                f"{m.queue.requests_per_s_per_replica:.1f}",
                f"{m.queue.burst_per_replica:.0f}",
                f"{m.prefix_hit_rate:.0%}",
                f"{m.prompt_microcredits_per_million / 1_000_000:.4f}",
            ]
            for m in models
        ],
    )


def _embedding_capacity_table(plan: FleetPlan) -> list[str]:
    """Per embedding model: memory (no KV cache), the inputs in flight per replica and the replicas
    at peak (a model's peak is its inputs in flight)."""
    models = _embedding(plan)
    if not models:
        return []
    return _table(
        [
            "embedding model",
            "dims",
            "GPUs/repl",
            "weights",
            "activations",
            "input",
            "max-model-len",
            "target",
            "max-num-seqs",
            "peak",
            "replicas",
            "bounds",
            "GPUs",
        ],
        [
            [
                m.name,
                str(m.embedding_dimensions),
                str(m.gpus_per_replica),
                f"{m.weights_gib:.1f} GiB",
                f"{m.encoder_activation_gib:.2f} GiB",
                f"{m.planning_context_tokens:,}",
                f"{m.max_model_len:,}",
                str(m.streams_target),
                str(m.max_num_seqs),
                str(m.peak_streams),
                str(m.replicas),
                f"{m.min_replicas}..{m.max_replicas}",
                str(m.gpus),
            ]
            for m in models
        ],
    )


def _embedding_economics_table(plan: FleetPlan) -> list[str]:
    """Per embedding model: prompt-token throughput, cost per million prompt tokens, one input's
    latency at the target and the queueing figures."""
    models = _embedding(plan)
    if not models:
        return []
    return _table(
        [
            "embedding model",
            "prompt tok/s/replica",
            "tok/s/input",
            "USD/M full",
            "USD/M 50%",
            "s/input",
            "inputs/s/replica",
            f"burst in {plan.queue_limit_s:.0f} s",
            "prompt tok/s at peak",
            "credits/M prompt",
        ],
        [
            [
                m.name,
                f"{m.prompt_tokens_per_s_per_replica:,.0f}",
                f"{m.tokens_per_s_per_stream:,.1f}",
                f"{m.cost_per_million_tokens_usd['full']:.3f}",
                f"{m.cost_per_million_tokens_usd['half']:.3f}",
                f"{m.queue.service_time_s:.2f}",
                f"{m.queue.requests_per_s_per_replica:.1f}",
                f"{m.queue.burst_per_replica:.0f}",
                f"{m.peak_streams * m.tokens_per_s_per_stream:,.0f}",
                f"{m.prompt_microcredits_per_million / 1_000_000:.4f}",
            ]
            for m in models
        ],
    )
