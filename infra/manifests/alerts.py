"""The one source of the platform's recording rules and alerts (the brief's SLIs and cost alerts).

`rule_groups(spec, office_hours)` returns Prometheus rule groups as plain dicts; the
PrometheusRule of the Pulumi program (`infra.manifests.monitoring`), the rule file of
`llmfleet dev --prometheus` and the promtool tests all render from here. Thresholds come from
the stack (`slo:` and `alerting:` in `stacks/<stack>.yaml`). Every alert carries a severity, a
summary and a `runbook_url` to its paragraph in `docs/runbook.md` (a test checks each exists).

An embedding model (`serving.task: embed`) produces no tokens after its prompt: its time to first
token is its whole answer and it has no tokens per second, so the TTFT, tokens-per-second and SLO
attainment alerts leave it out (`model!="<name>"`), and its measured cost is per million prompt tokens.

Label names are the exporters' own: `model` on llmfleet's gateway/orchestrator series,
`model_name` on `vllm:*`, `nodepool`/`resource_type` on Karpenter's, `deployment` on
kube-state-metrics'. A "replica" or "pod" is Prometheus' `instance` (the scrape target), which
exists both in the cluster and on a laptop.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from dataclasses import dataclass, field
from typing import Any

from apps.core.sizing.plan import FleetPlan
from apps.core.spec import StackSpec
from infra.config import OfficeHours
from infra.manifests.common import GPU_RESOURCE, NAMESPACE, slug
from infra.manifests.keda import ORCHESTRATOR_QUEUE_METRIC

RUNBOOK_URL = "https://github.com/llmfleet/llmfleet/blob/main/docs/runbook.md"
DRIFT_JOB = "ledger-drift"  # the CronJob's name (infra.manifests.ops)
DRIFT_METRIC = "llmfleet_ledger_drift_ratio"  # pushed by `llmfleet ops drift --push-gateway`


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    for_: str
    severity: str  # critical: page; warning: ticket; info: the weekly review
    summary: str
    labels: dict[str, str] = field(default_factory=dict)

    def render(self) -> dict[str, Any]:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity, **self.labels},
            "annotations": {"summary": self.summary, "runbook_url": f"{RUNBOOK_URL}#{self.name.lower()}"},
        }


def embedding_models(spec: StackSpec) -> list[str]:
    return [name for name, m in spec.models.items() if m.serving.task == "embed"]


def _generating(spec: StackSpec, label: str = "model") -> str:
    """A selector leaving the stack's embedding models out ("" when it has none)."""
    names = embedding_models(spec)
    return "{" + ",".join(f'{label}!="{n}"' for n in names) + "}" if names else ""


def _quantile(q: float, metric: str, by: str = "model", window: str = "5m") -> str:
    return f"histogram_quantile({q:g}, sum by ({by}, le) (rate({metric}_bucket[{window}])))"


def warm_window_expr(hours: OfficeHours) -> str:
    """1 while a scale-to-zero model's warm window (its KEDA cron trigger) may be open, else 0.

    PromQL's clock is UTC; the window is widened by the zone's DST hour (from the standard
    offset to the summer one), so the idle alert never fires inside the window."""
    start_h, start_days = _cron_hour_days(hours.start)
    end_h, _ = _cron_hour_days(hours.end)
    zone = zoneinfo.ZoneInfo(hours.timezone)
    offsets = [
        (dt.datetime(2026, month, 1, 12, tzinfo=zone).utcoffset() or dt.timedelta()).total_seconds() / 3600
        for month in (1, 7)
    ]
    first = int(start_h - max(offsets)) % 24
    last = int(end_h - min(offsets)) % 24
    if first >= last:
        raise ValueError(f"office hours {hours.start!r}..{hours.end!r} cross midnight UTC: not supported")
    days = ""
    if start_days != "*":
        lo, _, hi = start_days.partition("-")
        days = f" and on() day_of_week() >= {int(lo)} and on() day_of_week() <= {int(hi or lo)}"
    return f"(vector(1) and on() hour() >= {first} and on() hour() < {last}{days}) or on() vector(0)"


def _cron_hour_days(cron: str) -> tuple[int, str]:
    fields = cron.split()
    if len(fields) != 5 or not fields[1].isdigit() or fields[2:4] != ["*", "*"]:
        raise ValueError(f"office-hours cron {cron!r}: expected 'M H * * D[-D]'")
    return int(fields[1]), fields[4]


def recording_rules(spec: StackSpec, plan: FleetPlan, hours: OfficeHours) -> list[dict[str, str]]:
    price = _gpu_price(spec)
    rules = [
        ("llmfleet:ttft_seconds:p50", _quantile(0.5, "llmfleet_gateway_ttft_seconds")),
        ("llmfleet:ttft_seconds:p95", _quantile(0.95, "llmfleet_gateway_ttft_seconds")),
        (
            "llmfleet:stream_tokens_per_second:p50",
            _quantile(0.5, "llmfleet_gateway_stream_tokens_per_second"),
        ),
        (
            "llmfleet:stream_tokens_per_second:p05",
            _quantile(0.05, "llmfleet_gateway_stream_tokens_per_second"),
        ),
        ("llmfleet:queue_wait_seconds:p95", _quantile(0.95, "llmfleet_gateway_queue_wait_seconds")),
        ("llmfleet:requests:rate5m", "sum by (model, status) (rate(llmfleet_gateway_requests_total[5m]))"),
        (
            "llmfleet:refusals:rate5m",
            "sum by (model, status, reason) (rate(llmfleet_gateway_refusals_total[5m]))",
        ),
        ("llmfleet:preemptions:rate5m", "sum by (model_name) (rate(vllm:num_preemptions_total[5m]))"),
        ("llmfleet:generation_tokens:rate5m", "sum by (model_name) (rate(vllm:generation_tokens_total[5m]))"),
        (
            "llmfleet:slo_attainment:ratio1h",
            '(sum by (team, model) (rate(llmfleet_gateway_slo_requests_total{result="met"}[1h]))'
            " or 0 * sum by (team, model) (rate(llmfleet_gateway_slo_requests_total[1h])))"
            " / sum by (team, model) (rate(llmfleet_gateway_slo_requests_total[1h]))",
        ),
        (
            "llmfleet:gateway_tasks_per_stream",
            "llmfleet_gateway_asyncio_tasks / (llmfleet_gateway_active_streams + 1)",
        ),
        (
            "llmfleet:orchestrator_tasks_per_relay",
            "llmfleet_orchestrator_asyncio_tasks / (llmfleet_orchestrator_active_relays + 1)",
        ),
        (
            "llmfleet:gpus_idle",
            f"count(DCGM_FI_PROF_GR_ENGINE_ACTIVE < {spec.alerting.gpu_engine_active_min:g}) or vector(0)",
        ),
        ("llmfleet:gpus_idle:hours_7d", "avg_over_time(llmfleet:gpus_idle[7d]) * 168"),
        ("llmfleet:cloud_gpus", f'sum(karpenter_nodepools_usage{{resource_type="{GPU_RESOURCE}"}})'),
        ("llmfleet:cloud_gpu_spend_usd:hourly", f"llmfleet:cloud_gpus * {price:g}"),
        (
            "llmfleet:cloud_gpu_spend_usd:month_projected",
            f"avg_over_time(llmfleet:cloud_gpu_spend_usd:hourly[7d]) * {spec.cost.hours_per_month:g}",
        ),
        ("llmfleet:warm_window:active", warm_window_expr(hours)),
    ]
    # A serving replica is a vLLM scrape target; its GPUs are the plan's (one `or` per model).
    serving = " or ".join(
        f'count by (model_name) (vllm:num_requests_running{{model_name="{name}"}}) * {model.gpus_per_replica}'
        for name, model in plan.models.items()
    )
    rules.append(("llmfleet:gpus_serving", serving))
    rules.append(
        (
            "llmfleet:cost_per_million_tokens_usd",
            f"llmfleet:gpus_serving * {price:g} / on (model_name) ({_paid_tokens_per_s(spec)} * 3600 / 1e6)",
        )
    )
    return [{"record": name, "expr": expr} for name, expr in rules]


def _paid_tokens_per_s(spec: StackSpec) -> str:
    """Tokens per second each model is paid for: output tokens, an embedding model's prompt tokens."""
    generating = _generating(spec, "model_name")
    generated = f"sum by (model_name) (rate(vllm:generation_tokens_total{generating}[1h]))"
    embedded = " or ".join(
        f'sum by (model_name) (rate(vllm:prompt_tokens_total{{model_name="{n}"}}[1h]))'
        for n in embedding_models(spec)
    )
    return f"({generated} or {embedded})" if embedded else generated


def _gpu_price(spec: StackSpec) -> float:
    types = {m.serving.gpu_type for m in spec.models.values()}
    return max(spec.gpu_types[t].price_per_gpu_hour_usd for t in types)


def _ratio(status: str) -> str:
    return (
        f'sum by (model) (llmfleet:refusals:rate5m{{status="{status}"}})'
        " / sum by (model) (llmfleet:requests:rate5m)"
    )


def _task_growth(tasks: str, ratio: str, minimum: int) -> str:
    """Tasks growing while tasks per stream grow too: a ramp adds streams with their tasks (the
    ratio falls), a leak adds tasks without streams (the ratio rises)."""
    return (
        f"deriv({tasks}[1h]) > 0 and deriv({ratio}[1h]) > 0"
        f" and ({tasks} - min_over_time({tasks}[3h])) > {minimum}"
    )


def sli_alerts(spec: StackSpec) -> list[Alert]:
    slo, a = spec.slo, spec.alerting
    gen = _generating(spec)  # TTFT, tokens/s and their attainment: not an embedding model's SLIs
    return [
        Alert(
            "LlmfleetTtftP50High",
            f"llmfleet:ttft_seconds:p50{gen} > {slo.ttft_p50_s:g}",
            "10m",
            "warning",
            f"{{{{ $labels.model }}}}: median time to first token above {slo.ttft_p50_s:g} s",
        ),
        Alert(
            "LlmfleetTtftP95High",
            f"llmfleet:ttft_seconds:p95{gen} > {slo.ttft_p95_s:g}",
            "10m",
            "critical",
            f"{{{{ $labels.model }}}}: p95 time to first token above {slo.ttft_p95_s:g} s",
        ),
        Alert(
            "LlmfleetStreamTokensPerSecondLow",
            f"llmfleet:stream_tokens_per_second:p05{gen} < {slo.tokens_per_s_per_stream:g}",
            "15m",
            "warning",
            f"{{{{ $labels.model }}}}: 5 % of streams get under {slo.tokens_per_s_per_stream:g} tokens/s",
        ),
        Alert(
            "LlmfleetQueueWaitP95High",
            f"llmfleet:queue_wait_seconds:p95 > {slo.queue_wait_p95_s:g}",
            "10m",
            "warning",
            f"{{{{ $labels.model }}}}: p95 queue wait for a node above {slo.queue_wait_p95_s:g} s",
        ),
        Alert(
            "LlmfleetUnavailableRatioHigh",
            f"{_ratio('503')} > {a.error_ratio_max:g}",
            "10m",
            "critical",
            f"{{{{ $labels.model }}}}: more than {a.error_ratio_max:.0%} of requests answered 503",
        ),
        Alert(
            "LlmfleetRateLimitedRatioHigh",
            f"{_ratio('429')} > {a.error_ratio_max:g}",
            "10m",
            "warning",
            f"{{{{ $labels.model }}}}: more than {a.error_ratio_max:.0%} of requests answered 429",
        ),
        Alert(
            "LlmfleetKvCacheNearlyFull",
            f"max by (model_name, instance) (vllm:kv_cache_usage_perc) > {a.kv_cache_usage_max:g}",
            a.kv_cache_for,
            "warning",
            f"{{{{ $labels.instance }}}}: KV cache above {a.kv_cache_usage_max:.0%}: preemptions and TTFT"
            " spikes follow",
        ),
        Alert(
            "LlmfleetPreemptionsRising",
            f"llmfleet:preemptions:rate5m > {a.preemptions_per_s_max:g}",
            "10m",
            "warning",
            f"{{{{ $labels.model_name }}}}: more than {a.preemptions_per_s_max:g} preemptions per second",
        ),
        Alert(
            "LlmfleetTeamSloAttainmentLow",
            f"llmfleet:slo_attainment:ratio1h{gen} < {a.slo_attainment_min:g}"
            " and on (team, model) sum by (team, model) (rate(llmfleet_gateway_slo_requests_total[1h]))"
            " > 0.01",
            "30m",
            "warning",
            f"team {{{{ $labels.team }}}} on {{{{ $labels.model }}}}: under {a.slo_attainment_min:.0%}"
            " of requests met the TTFT and tokens/s targets",
        ),
        Alert(
            "LlmfleetGatewayTasksGrowing",
            _task_growth(
                "llmfleet_gateway_asyncio_tasks", "llmfleet:gateway_tasks_per_stream", a.task_growth_min
            ),
            a.task_growth_for,
            "warning",
            "{{ $labels.instance }}: gateway tasks grow without streams: a stream is not released",
        ),
        Alert(
            "LlmfleetOrchestratorTasksGrowing",
            _task_growth(
                "llmfleet_orchestrator_asyncio_tasks",
                "llmfleet:orchestrator_tasks_per_relay",
                a.task_growth_min,
            ),
            a.task_growth_for,
            "warning",
            "{{ $labels.instance }}: orchestrator tasks grow without relays: a relay is not released",
        ),
        Alert(
            "LlmfleetLedgerDriftHigh",
            f"{DRIFT_METRIC} > {a.ledger_drift_max:g}",
            "0m",
            "critical",
            f"settled tokens and vllm:generation_tokens differ by more than {a.ledger_drift_max:.1%}",
        ),
        Alert(
            "LlmfleetLedgerDriftJobFailed",
            f'kube_job_status_failed{{namespace="{NAMESPACE}", job_name=~"{DRIFT_JOB}-.*"}} > 0',
            "0m",
            "warning",
            "the daily ledger-drift job failed (drift above target, or it could not run)",
        ),
        Alert(
            # A node reported more completion tokens than it relayed (issue 27): it was settled at
            # the relayed count and quarantined; a person decides whether it gets a new token.
            "LlmfleetNodeUsageUnrelayed",
            "sum by (instance) (increase(llmfleet_orchestrator_usage_unrelayed_total[15m])) > 0",
            "0m",
            "critical",
            "{{ $labels.instance }}: a node reported usage its relayed output does not support; it is"
            " quarantined",
        ),
        Alert(
            # An orchestrator replica rolled a canary revision back (issue 30 item 3): it broke its TTFT,
            # tokens/s or error bound against the stable revision; a person looks before a new canary.
            "LlmfleetCanaryRolledBack",
            "sum by (model, revision) (increase(llmfleet_orchestrator_canary_rollbacks_total[15m])) > 0",
            "0m",
            "warning",
            "canary {{ $labels.revision }} of {{ $labels.model }} was rolled back automatically",
        ),
        Alert(
            "LlmfleetTargetDown", "up == 0", "5m", "warning", "{{ $labels.job }} {{ $labels.instance }} down"
        ),
    ]


def cost_alerts(spec: StackSpec, plan: FleetPlan) -> list[Alert]:
    a = spec.alerting
    alerts = [
        Alert(
            "LlmfleetGpuIdle",
            f"DCGM_FI_PROF_GR_ENGINE_ACTIVE < {a.gpu_engine_active_min:g}",
            a.gpu_idle_for,
            "info",
            f"GPU {{{{ $labels.gpu }}}} on {{{{ $labels.instance }}}}: graphics engine active below"
            f" {a.gpu_engine_active_min:.0%} for {a.gpu_idle_for}",
        ),
        Alert(
            "LlmfleetNodePoolGpusNearLimit",
            f'karpenter_nodepools_usage{{resource_type="{GPU_RESOURCE}"}}'
            f' / on (nodepool, resource_type) karpenter_nodepools_limit{{resource_type="{GPU_RESOURCE}"}}'
            f" > {a.nodepool_gpu_limit_ratio:g}",
            "15m",
            "warning",
            f"NodePool {{{{ $labels.nodepool }}}} uses more than {a.nodepool_gpu_limit_ratio:.0%} of its GPU"
            " limit: the next scale-out stays pending",
        ),
        Alert(
            "LlmfleetGpuSpendOverBudget",
            f"llmfleet:cloud_gpu_spend_usd:month_projected > {a.monthly_gpu_budget_usd:g}",
            "1h",
            "warning",
            f"projected cloud GPU spend this month above {a.monthly_gpu_budget_usd:,.0f} USD",
        ),
    ]
    for name, model in plan.models.items():
        if model.min_replicas != 0:
            continue
        # A canary's Deployment keeps its floor on purpose (`canary.min_replicas`): not idle capacity.
        canary = f',deployment!="vllm-{slug(name)}-canary"' if spec.models[name].canary is not None else ""
        alerts.append(
            Alert(
                "LlmfleetScaleToZeroModelIdle",
                f'sum(kube_deployment_status_replicas{{namespace="{NAMESPACE}",deployment=~"vllm-{slug(name)}.*"{canary}}})'
                f' > 0 and on() sum({ORCHESTRATOR_QUEUE_METRIC}{{model="{name}"}}) == 0'
                f' and on() sum(vllm:num_requests_running{{model_name="{name}"}}) == 0'
                " unless on() llmfleet:warm_window:active == 1",
                a.scale_to_zero_idle_for,
                "info",
                f"{name} runs replicas with an empty queue outside its warm window",
                labels={"model": name},
            )
        )
    return alerts


def rule_groups(spec: StackSpec, plan: FleetPlan, hours: OfficeHours) -> list[dict[str, Any]]:
    return [
        {"name": "llmfleet.records", "rules": recording_rules(spec, plan, hours)},
        {"name": "llmfleet.slis", "rules": [x.render() for x in sli_alerts(spec)]},
        {"name": "llmfleet.cost", "rules": [x.render() for x in cost_alerts(spec, plan)]},
    ]


def rules_file(spec: StackSpec, plan: FleetPlan, hours: OfficeHours) -> dict[str, Any]:
    """The same groups as a Prometheus rule file (what promtool and `llmfleet dev --prometheus` load)."""
    return {"groups": rule_groups(spec, plan, hours)}
