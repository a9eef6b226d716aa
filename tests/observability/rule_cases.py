"""promtool unit tests, one firing and one quiet case per alert, on synthetic series.

`promtool_tests(spec, plan, hours)` builds the `promtool test rules` document for the rule
groups of `infra.manifests.alerts`; expected annotations are the alert's own summary with its
labels filled in, so a changed threshold or label shows up as a FAILED diff. Evaluation starts
at the Unix epoch (a Thursday, 00:00 UTC), which the warm-window cases rely on. The TTFT,
tokens-per-second and SLO-attainment alerts also get a quiet case per embedding model of the stack,
on the very series that fire them for a chat model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from apps.core.sizing.plan import FleetPlan
from apps.core.spec import StackSpec
from infra.manifests.alerts import RUNBOOK_URL, Alert, cost_alerts, sli_alerts
from infra.manifests.common import slug

Series = list[dict[str, str]]
M = "llama-3.1-8b-instruct"


def s(name: str, values: str, **labels: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return {"series": f"{name}{{{inner}}}" if inner else name, "values": values}


def hist(metric: str, per_min: dict[str, float], minutes: int, **labels: str) -> Series:
    """A cumulative histogram growing at `per_min` observations per minute per bucket (cumulative)."""
    return [s(f"{metric}_bucket", f"0+{n:g}x{minutes}", le=le, **labels) for le, n in per_min.items()]


@dataclass(frozen=True)
class Case:
    alert: str
    eval_min: int
    firing: Series
    quiet: Series
    labels: dict[str, str]  # the firing alert's labels besides severity
    quiet_eval_min: int | None = None


def _expand(summary: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), summary)


def _tasks(prefix: str, streams_metric: str) -> tuple[Series, Series]:
    lab = {"instance": "pod-a:8080", "job": prefix}
    leak = [s(f"llmfleet_{prefix}_asyncio_tasks", "100+2x300", **lab), s(streams_metric, "20x300", **lab)]
    # A traffic ramp: tasks follow the streams (10 + 4 per stream), the per-stream ratio falls.
    ramp = [s(f"llmfleet_{prefix}_asyncio_tasks", "10+4x300", **lab), s(streams_metric, "0+1x300", **lab)]
    return leak, ramp


def cases(plan: FleetPlan) -> list[Case]:
    gw_leak, gw_ramp = _tasks("gateway", "llmfleet_gateway_active_streams")
    or_leak, or_ramp = _tasks("orchestrator", "llmfleet_orchestrator_active_relays")
    kv = {"model_name": M, "engine": "0", "instance": "10.0.0.1:8000", "job": "vllm"}
    dcgm = {"gpu": "0", "UUID": "GPU-1", "Hostname": "node-1", "instance": "10.0.0.2:9400", "job": "dcgm"}
    pool = {"nodepool": "gpu-on-demand", "resource_type": "nvidia.com/gpu"}
    gpu = "karpenter_nodepools_usage"
    limit = "karpenter_nodepools_limit"
    zero = next(n for n, m in plan.models.items() if m.min_replicas == 0)
    zero_dep = f"vllm-{slug(zero)}"
    idle70 = [
        s("kube_deployment_status_replicas", "1x700", namespace="llmfleet", deployment=zero_dep),
        s("llmfleet_orchestrator_queue_depth", "0x700", model=zero, instance="o:8081"),
        s("vllm:num_requests_running", "0x700", model_name=zero, engine="0", instance="v:8000"),
    ]
    busy70 = [*idle70[:1], s("llmfleet_orchestrator_queue_depth", "3x700", model=zero), *idle70[2:]]
    ttft = "llmfleet_gateway_ttft_seconds"
    tps = "llmfleet_gateway_stream_tokens_per_second"
    qw = "llmfleet_gateway_queue_wait_seconds"
    slo = "llmfleet_gateway_slo_requests_total"
    canary = {"model": M, "revision": "r2"}

    def ratio(status: str, refused: str) -> Series:
        return [
            s("llmfleet_gateway_requests_total", "0+90x30", model=M, status="200"),
            s("llmfleet_gateway_requests_total", "0+10x30", model=M, status=status),
            s("llmfleet_gateway_refusals_total", refused, model=M, status=status, reason="queue_timeout"),
        ]

    return [*_generation_cases(M, ttft, tps, slo), *_embedding_cases(plan, ttft, tps, slo),
        Case("LlmfleetQueueWaitP95High", 20, hist(qw, {"5": 0, "10": 10, "+Inf": 10}, 30, model=M),
             hist(qw, {"1": 10, "+Inf": 10}, 30, model=M), {"model": M}),
        Case("LlmfleetUnavailableRatioHigh", 20, ratio("503", "0+10x30"), ratio("503", "0x30"), {"model": M}),
        Case("LlmfleetRateLimitedRatioHigh", 20, ratio("429", "0+10x30"), ratio("429", "0x30"), {"model": M}),
        Case("LlmfleetKvCacheNearlyFull", 7, [s("vllm:kv_cache_usage_perc", "0.95x20", **kv)],
             [s("vllm:kv_cache_usage_perc", "0.5x20", **kv)], {"model_name": M, "instance": kv["instance"]}),
        Case("LlmfleetPreemptionsRising", 20, [s("vllm:num_preemptions_total", "0+120x30", **kv)],
             [s("vllm:num_preemptions_total", "0+6x30", **kv)], {"model_name": M}),
        Case("LlmfleetGatewayTasksGrowing", 250, gw_leak, gw_ramp, {"instance": "pod-a:8080", "job": "gateway"}),
        Case("LlmfleetOrchestratorTasksGrowing", 250, or_leak, or_ramp,
             {"instance": "pod-a:8080", "job": "orchestrator"}),
        Case("LlmfleetLedgerDriftHigh", 2, [s("llmfleet_ledger_drift_ratio", "0.002x10")],
             [s("llmfleet_ledger_drift_ratio", "0.0005x10")], {}),
        Case("LlmfleetLedgerDriftJobFailed", 2,
             [s("kube_job_status_failed", "1x10", namespace="llmfleet", job_name="ledger-drift-29420")],
             [s("kube_job_status_failed", "0x10", namespace="llmfleet", job_name="ledger-drift-29420"),
              s("kube_job_status_failed", "1x10", namespace="llmfleet", job_name="llmfleet-migrate")],
             {"namespace": "llmfleet", "job_name": "ledger-drift-29420"}),
        Case("LlmfleetNodeUsageUnrelayed", 10,
             [s("llmfleet_orchestrator_usage_unrelayed_total", "0x5 1x15", instance="o:8083")],
             [s("llmfleet_orchestrator_usage_unrelayed_total", "1x20", instance="o:8083")], {"instance": "o:8083"}),
        Case("LlmfleetCanaryRolledBack", 10,
             [s("llmfleet_orchestrator_canary_rollbacks_total", "0x5 1x15", instance="o:8083", **canary)],
             [s("llmfleet_orchestrator_canary_rollbacks_total", "1x20", instance="o:8083", **canary)], canary),
        Case("LlmfleetTargetDown", 7, [s("up", "0x10", job="gateway", instance="gw:8080")],
             [s("up", "1x10", job="gateway", instance="gw:8080")], {"job": "gateway", "instance": "gw:8080"}),
        Case("LlmfleetGpuIdle", 70, [s("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "0.1x90", **dcgm)],
             [s("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "0.5x90", **dcgm)], dcgm),
        Case("LlmfleetNodePoolGpusNearLimit", 20, [s(gpu, "15x30", **pool), s(limit, "16x30", **pool)],
             [s(gpu, "8x30", **pool), s(limit, "16x30", **pool)], pool),
        # 14 GPUs x 2.5 USD x 730 h = 25,550 USD > 20,000; 8 GPUs = 14,600 USD.
        Case("LlmfleetGpuSpendOverBudget", 70, [s(gpu, "14x90", **pool)], [s(gpu, "8x90", **pool)], {}),
        # Up and idle from Thursday 00:00 UTC: fires at 02:10; at 10:00 the warm window is open.
        Case("LlmfleetScaleToZeroModelIdle", 130, idle70, busy70, {"model": zero}),
        Case("LlmfleetScaleToZeroModelIdle", 600, idle70, idle70, {"model": zero}, quiet_eval_min=600),
    ]  # fmt: skip


def _slow(model: str, ttft: str, tps: str, slo: str) -> dict[str, Series]:
    """Series that break each TTFT / tokens-per-second SLI of `model`, by alert."""
    return {
        "LlmfleetTtftP50High": hist(ttft, {"0.5": 0, "3": 10, "+Inf": 10}, 30, model=model),
        "LlmfleetTtftP95High": hist(ttft, {"2": 0, "5": 10, "+Inf": 10}, 30, model=model),
        "LlmfleetStreamTokensPerSecondLow": hist(tps, {"10": 10, "+Inf": 10}, 40, model=model),
        "LlmfleetTeamSloAttainmentLow": [
            s(slo, "0+50x90", team="t1", model=model, result="met"),
            s(slo, "0+50x90", team="t1", model=model, result="missed"),
        ],
    }


# When each of those alerts is read: after its `for` has passed on the slow series.
_SLI_EVAL_MIN = {
    "LlmfleetTtftP50High": 20,
    "LlmfleetTtftP95High": 20,
    "LlmfleetStreamTokensPerSecondLow": 25,
    "LlmfleetTeamSloAttainmentLow": 80,
}


def _sli_labels(alert: str, model: str) -> dict[str, str]:
    team = {"team": "t1"} if alert == "LlmfleetTeamSloAttainmentLow" else {}
    return {**team, "model": model}


def _generation_cases(model: str, ttft: str, tps: str, slo: str) -> list[Case]:
    slow = _slow(model, ttft, tps, slo)
    fast = {
        "LlmfleetTtftP50High": hist(ttft, {"0.5": 10, "+Inf": 10}, 30, model=model),
        "LlmfleetTtftP95High": hist(ttft, {"2": 10, "+Inf": 10}, 30, model=model),
        "LlmfleetStreamTokensPerSecondLow": hist(tps, {"20": 0, "50": 10, "+Inf": 10}, 40, model=model),
        "LlmfleetTeamSloAttainmentLow": [
            s(slo, "0+100x90", team="t1", model=model, result="met"),
            s(slo, "0+1x90", team="t1", model=model, result="missed"),
        ],
    }
    return [
        Case(name, t, slow[name], fast[name], _sli_labels(name, model)) for name, t in _SLI_EVAL_MIN.items()
    ]


def _embedding_cases(plan: FleetPlan, ttft: str, tps: str, slo: str) -> list[Case]:
    """An embedding model's answer is its first byte and it streams no tokens (issue 31): the very
    series that fire these alerts for a chat model leave them quiet for it."""
    return [
        Case(name, t, [], _slow(model, ttft, tps, slo)[name], _sli_labels(name, model), quiet_eval_min=t)
        for model in (n for n, m in plan.models.items() if m.task == "embed")
        for name, t in _SLI_EVAL_MIN.items()
    ]


def _alert_test(case: Case, alert: Alert, series: Series, minute: int, firing: bool) -> dict[str, Any]:
    labels = {**case.labels, **alert.labels}
    expected = []
    if firing:
        expected.append(
            {
                "exp_labels": {"severity": alert.severity, **labels},
                "exp_annotations": {
                    "summary": _expand(alert.summary, labels),
                    "runbook_url": f"{RUNBOOK_URL}#{alert.name.lower()}",
                },
            }
        )
    return {
        "interval": "1m",
        "input_series": series,
        "alert_rule_test": [{"eval_time": f"{minute}m", "alertname": alert.name, "exp_alerts": expected}],
    }


def promtool_tests(
    spec: StackSpec, plan: FleetPlan, rule_file: str, only: set[str] | None = None
) -> dict[str, Any]:
    alerts = [*sli_alerts(spec), *cost_alerts(spec, plan)]
    tests = []
    for case in cases(plan):
        if only is not None and case.alert not in only:
            continue
        # One alert name may exist per model (its `model` label tells them apart).
        alert = next(a for a in alerts if a.name == case.alert and a.labels.items() <= case.labels.items())
        if case.quiet_eval_min is None:
            tests.append(_alert_test(case, alert, case.firing, case.eval_min, firing=True))
        tests.append(_alert_test(case, alert, case.quiet, case.quiet_eval_min or case.eval_min, firing=False))
    return {"rule_files": [rule_file], "evaluation_interval": "1m", "tests": tests}


def covered_alerts(plan: FleetPlan) -> set[str]:
    return {c.alert for c in cases(plan) if c.quiet_eval_min is None}
