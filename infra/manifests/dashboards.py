"""Grafana dashboards as code (grafana-foundation-sdk builders), provisioned as ConfigMaps.

Three boards: the platform overview, per-team usage, the on-premises fleet. Each has the
Prometheus datasource, `model` and `team` variables (multi-select, "All" = `.*`), and panels
whose queries read the recording rules of `infra.manifests.alerts` where one exists.
kube-prometheus-stack's Grafana sidecar loads every ConfigMap labelled `grafana_dashboard: "1"`
in any namespace (chart 79.5.0's `grafana.sidecar.dashboards` defaults: `label`, `labelValue`,
`searchNamespace: ALL`; vendored in tests/fixtures/infra/charts/ and checked by
tests/infra/test_grafana_sidecar.py). They live in Grafana's own namespace all the same.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as gm

from apps.core.spec import StackSpec
from infra.manifests.common import MONITORING_NAMESPACE, Manifest, labels

SIDECAR_LABEL = {"grafana_dashboard": "1"}
DATASOURCE = gm.DataSourceRef(type_val="prometheus", uid="${datasource}")
M = 'model=~"$model"'
MN = 'model_name=~"$model"'
T = 'team=~"$team"'
RI = "$__rate_interval"
_REV_REQ = "llmfleet_gateway_revision_requests_total"
_CACHE_REQ = "llmfleet_gateway_cache_requests_total"
_CACHE_SAVED = "llmfleet_gateway_cache_saved_gpu_seconds_total"
_SAVED_DESC = (
    "The hits' completion tokens x the model's planning figure (a replica's GPUs / its decode tokens/s in the "
    "stack spec): an estimate, not a measurement; the console shows the same per team from the ledger."
)


@dataclass(frozen=True)
class Panel:
    title: str
    queries: tuple[tuple[str, str], ...]  # (expr, legend)
    unit: str = "short"
    kind: str = "timeseries"  # or "stat"
    description: str = ""


def _p(
    title: str, *queries: tuple[str, str], unit: str = "short", kind: str = "timeseries", desc: str = ""
) -> Panel:
    return Panel(title, tuple(queries), unit, kind, desc)


def _cache_panels(per: str, by: str, legend: str, selector: str, window: str) -> list[Panel]:
    """The response cache's hit rate and GPU time saved per `per`, summed `by` those labels."""
    asked = f'{_CACHE_REQ}{{{selector},result=~"exact_hit|semantic_hit|miss"}}'
    hits = f'{_CACHE_REQ}{{{selector},result=~"exact_hit|semantic_hit"}}'
    return [
        _p(
            f"Response cache hit rate per {per}",
            (
                f"(sum by ({by}) (rate({hits}[{window}])) or sum by ({by}) (rate({asked}[{window}])) * 0) / "
                f"clamp_min(sum by ({by}) (rate({asked}[{window}])), 1e-9)",
                legend,
            ),
            unit="percentunit",
            desc="hits / (hits + misses) of the requests the cache was asked for (its team's policy names the "
            "model, the request is cacheable); bypassed requests and failed lookups are in neither.",
        ),
        _p(
            f"GPU time saved by the response cache per {per} (GPU-seconds per second)",
            (f"sum by ({by}) (rate({_CACHE_SAVED}{{{selector}}}[{window}]))", legend),
            desc=_SAVED_DESC,
        ),
    ]


def overview_panels(spec: StackSpec) -> list[Panel]:
    slo = spec.slo
    return [
        _p(
            "Requests per second by status",
            (f"sum by (model, status) (llmfleet:requests:rate5m{{{M}}})", "{{model}} {{status}}"),
            unit="reqps",
        ),
        _p(
            "429 and 503 by reason",
            (f"sum by (status, reason) (llmfleet:refusals:rate5m{{{M}}})", "{{status}} {{reason}}"),
            unit="reqps",
        ),
        _p(
            "Time to first token p50 / p95",
            (f"llmfleet:ttft_seconds:p50{{{M}}}", "p50 {{model}}"),
            (f"llmfleet:ttft_seconds:p95{{{M}}}", "p95 {{model}}"),
            unit="s",
            desc=f"Targets: p50 under {slo.ttft_p50_s:g} s, p95 under {slo.ttft_p95_s:g} s (gateway: request to first byte).",
        ),
        _p(
            "Time to first token p95 by model revision",
            (
                "histogram_quantile(0.95, sum by (le, model, revision) "
                f"(rate(llmfleet_gateway_revision_ttft_seconds_bucket{{{M}}}[5m])))",
                "{{model}} {{revision}}",
            ),
            unit="s",
            desc="Each live revision of a model side by side, as its nodes registered it (the ledger records the "
            "same per request: `llmfleet ops audit`).",
        ),
        _p(
            "Failed streams by model revision (share of relayed requests)",
            (
                f'(sum by (model, revision) (rate({_REV_REQ}{{{M},ended=~"upstream_error|timeout"}}[5m])) '
                f"or sum by (model, revision) (rate({_REV_REQ}{{{M}}}[5m])) * 0) / "
                f"clamp_min(sum by (model, revision) (rate({_REV_REQ}{{{M}}}[5m])), 1e-9)",
                "{{model}} {{revision}}",
            ),
            unit="percentunit",
            desc="An engine error or a stall after the node took the request (client disconnects excluded).",
        ),
        _p(
            "Output tokens per second per stream (p05 / p50)",
            (f"llmfleet:stream_tokens_per_second:p05{{{M}}}", "p05 {{model}}"),
            (f"llmfleet:stream_tokens_per_second:p50{{{M}}}", "p50 {{model}}"),
            desc=f"Each stream's own rate, observed when it ends. Target: at least {slo.tokens_per_s_per_stream:g}.",
        ),
        _p(
            "Queue depth per model",
            (f"sum by (model) (llmfleet_orchestrator_queue_depth{{{M}}})", "{{model}}"),
        ),
        _p("Queue wait p95 per model", (f"llmfleet:queue_wait_seconds:p95{{{M}}}", "{{model}}"), unit="s"),
        _p(
            "Queue wait p95 per team and class",
            (
                "histogram_quantile(0.95, sum by (le, team_id, class) "
                f"(rate(llmfleet_orchestrator_team_queue_wait_seconds_bucket{{{M}}}[5m])))",
                "team {{team_id}} {{class}}",
            ),
            unit="s",
            desc='The fair queue by team (weights, batch behind interactive): docs/quotas-and-billing.md "Sharing the fleet".',
        ),
        _p(
            "KV-cache use per replica",
            (
                f"max by (model_name, instance) (vllm:kv_cache_usage_perc{{{MN}}})",
                "{{model_name}} {{instance}}",
            ),
            unit="percentunit",
        ),
        _p(
            "Prefix-cache hit rate per model",
            (
                f"sum by (model_name) (rate(vllm:prefix_cache_hits_total{{{MN}}}[5m])) / "
                f"clamp_min(sum by (model_name) (rate(vllm:prefix_cache_queries_total{{{MN}}}[5m])), 1)",
                "{{model_name}}",
            ),
            unit="percentunit",
            desc="Prompt tokens the engines found cached, of all they looked up (the engines' own counters; "
            "on-premises engines are not scraped). The plan's serving.prefix_hit_rate: docs/planner.md.",
        ),
        _p(
            "Picks by prefix outcome",
            (
                f"sum by (model, outcome) (rate(llmfleet_orchestrator_prefix_picks_total{{{M}}}[5m]))",
                "{{model}} {{outcome}}",
            ),
            unit="reqps",
            desc="hit: the node taken held part of the conversation; miss: another node did; none: no node did "
            "(docs/prefix-routing.md).",
        ),
        *_cache_panels("model", "model", "{{model}}", M, "5m"),
        _p(
            "GPU hours saved by the response cache (time range)",
            (f"sum(increase({_CACHE_SAVED}{{{M}}}[$__range])) / 3600", "GPU hours"),
            kind="stat",
            desc=_SAVED_DESC,
        ),
        _p(
            "Response cache lookup p95 on misses",
            (
                "histogram_quantile(0.95, sum by (le, model, match) "
                f'(rate(llmfleet_gateway_cache_lookup_seconds_bucket{{{M},result="miss"}}[5m])))',
                "{{model}} {{match}}",
            ),
            unit="s",
            desc="What the cache adds to a request the fleet then answers. exact: the exact match alone; "
            "semantic: the question also embedded by the fleet and matched by similarity (docs/observability.md).",
        ),
        _p("Preemptions per second", (f"llmfleet:preemptions:rate5m{{{MN}}}", "{{model_name}}")),
        _p(
            "Running and waiting requests",
            (f"sum by (model_name) (vllm:num_requests_running{{{MN}}})", "running {{model_name}}"),
            (f"sum by (model_name) (vllm:num_requests_waiting{{{MN}}})", "waiting {{model_name}}"),
        ),
        _p(
            "GPU graphics engine active (DCGM)",
            ("avg by (instance, gpu) (DCGM_FI_PROF_GR_ENGINE_ACTIVE)", "{{instance}} gpu {{gpu}}"),
            unit="percentunit",
        ),
        _p("Nodes by state", ("sum by (state) (llmfleet_orchestrator_nodes)", "{{state}}")),
        _p("Nodes by location", ("sum by (location) (llmfleet_orchestrator_fleet_nodes)", "{{location}}")),
        _p(
            "Ledger drift (daily job)",
            ("max(llmfleet_ledger_drift_ratio) or on() vector(0)", "drift"),
            unit="percentunit",
            kind="stat",
        ),
        _p(
            "Measured cost per million tokens",
            (f"llmfleet:cost_per_million_tokens_usd{{{MN}}}", "{{model_name}}"),
            unit="currencyUSD",
            desc="Per million output tokens; an embedding model's per million prompt tokens (it produces none).",
        ),
        _p("Idle GPU hours (last 7 days)", ("llmfleet:gpus_idle:hours_7d", "GPU hours"), kind="stat"),
        _p(
            "Projected monthly cloud GPU spend",
            ("llmfleet:cloud_gpu_spend_usd:month_projected", "USD"),
            unit="currencyUSD",
            kind="stat",
        ),
    ]


def team_panels(spec: StackSpec) -> list[Panel]:
    return [
        _p(
            "SLO attainment per team",
            (f"llmfleet:slo_attainment:ratio1h{{{T},{M}}}", "{{team}} {{model}}"),
            unit="percentunit",
            desc=f"Share of finished requests with TTFT under {spec.slo.ttft_p95_s:g} s and at least {spec.slo.tokens_per_s_per_stream:g} tokens/s.",
        ),
        _p(
            "Requests per team",
            (
                f"sum by (team, model) (rate(llmfleet_gateway_slo_requests_total{{{T},{M}}}[{RI}]))",
                "{{team}} {{model}}",
            ),
            unit="reqps",
        ),
        _p(
            "Requests missing the SLO",
            (
                f'sum by (team, model) (rate(llmfleet_gateway_slo_requests_total{{{T},{M},result="missed"}}[{RI}])) or on() vector(0)',
                "{{team}} {{model}}",
            ),
            unit="reqps",
        ),
        *_cache_panels("team", "team, model", "{{team}} {{model}}", f"{T},{M}", RI),
        _p(
            "Output tokens per model",
            (f"sum by (model) (rate(llmfleet_gateway_output_tokens_total{{{M}}}[{RI}]))", "{{model}}"),
        ),
        _p(
            "Refusals by reason",
            (f"sum by (reason) (rate(llmfleet_gateway_rejections_total[{RI}]))", "{{reason}}"),
            unit="reqps",
        ),
    ]


def fleet_panels(spec: StackSpec) -> list[Panel]:
    onprem = 'location="onprem"'
    return [
        _p(
            "Registered on-premises nodes",
            (f"sum(llmfleet_orchestrator_fleet_nodes{{{onprem}}}) or on() vector(0)", "nodes"),
            kind="stat",
        ),
        _p(
            "Nodes by location and state",
            ("sum by (location, state) (llmfleet_orchestrator_fleet_nodes)", "{{location}} {{state}}"),
        ),
        _p(
            "Heartbeat age per node",
            ("max by (node_id, location) (llmfleet_orchestrator_node_heartbeat_age_seconds)", "{{node_id}}"),
            unit="s",
        ),
        _p(
            "GPU use per node (heartbeat)",
            (
                "max by (node_id, location) (llmfleet_orchestrator_node_gpu_utilization) or on() vector(0)",
                "{{node_id}}",
            ),
            unit="percentunit",
        ),
        _p(
            "Reconnects (registrations) per minute",
            ("sum(rate(llmfleet_orchestrator_registrations_total[$__rate_interval])) * 60", "registrations"),
        ),
        _p(
            "Registration refusals by reason (rate limit, bad token...)",
            (
                "sum by (reason) (rate(llmfleet_orchestrator_registrations_refused_total[$__rate_interval])) or on() vector(0)",
                "{{reason}}",
            ),
            unit="reqps",
        ),
        _p(
            "Node deaths by reason",
            (
                "sum by (reason) (rate(llmfleet_orchestrator_node_deaths_total[$__rate_interval])) or on() vector(0)",
                "{{reason}}",
            ),
        ),
    ]


def _variables(board: gd.Dashboard) -> gd.Dashboard:
    ds = gd.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
    model = (
        gd.QueryVariable("model")
        .label("Model")
        .datasource(DATASOURCE)
        .query("label_values(llmfleet_orchestrator_queue_depth, model)")
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .refresh(gm.VariableRefresh.ON_TIME_RANGE_CHANGED)
    )
    team = (
        gd.QueryVariable("team")
        .label("Team")
        .datasource(DATASOURCE)
        .query("label_values(llmfleet_gateway_slo_requests_total, team)")
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .refresh(gm.VariableRefresh.ON_TIME_RANGE_CHANGED)
    )
    return board.with_variable(ds).with_variable(model).with_variable(team)


def _panel(p: Panel) -> timeseries.Panel | stat.Panel:
    builder: timeseries.Panel | stat.Panel = stat.Panel() if p.kind == "stat" else timeseries.Panel()
    builder.title(p.title).unit(p.unit).datasource(DATASOURCE).height(8).span(12 if p.kind != "stat" else 6)
    if p.description:
        builder.description(p.description)
    for index, (expr, legend) in enumerate(p.queries):
        builder.with_target(
            prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + index))
        )
    return builder


def build(uid: str, title: str, panels: list[Panel]) -> dict[str, Any]:
    board = gd.Dashboard(title).uid(uid).tags(["llmfleet"]).refresh("30s").time("now-6h", "now")
    board = _variables(board)
    for p in panels:
        board.with_panel(_panel(p))
    data: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return data


def dashboards(spec: StackSpec) -> dict[str, dict[str, Any]]:
    return {
        "llmfleet-overview": build("llmfleet-overview", "llmfleet: platform overview", overview_panels(spec)),
        "llmfleet-teams": build("llmfleet-teams", "llmfleet: usage per team", team_panels(spec)),
        "llmfleet-fleet": build("llmfleet-fleet", "llmfleet: on-premises fleet", fleet_panels(spec)),
    }


def panel_queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every target of a rendered dashboard."""
    return [(p["title"], t["expr"]) for p in board.get("panels", []) for t in p.get("targets", [])]


def dashboard_config_maps(spec: StackSpec) -> list[Manifest]:
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": f"dashboard-{name}",
                "namespace": MONITORING_NAMESPACE,
                "labels": {**labels("grafana-dashboards"), **SIDECAR_LABEL},
            },
            "data": {f"{name}.json": json.dumps(board, sort_keys=True)},
        }
        for name, board in dashboards(spec).items()
    ]
