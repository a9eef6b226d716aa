"""`llmfleet ops drift --from --to` and `llmfleet ops cost-report --week YYYY-Www`.

drift: prints the ledger's settled completion tokens, the engines' `vllm:generation_tokens`
increase and the drift; exit 1 above the stack's `alerting.ledger_drift_max`; with
`--push-gateway` the result is also pushed as `llmfleet_ledger_drift_ratio`.
cost-report: Markdown on stdout; with `--out DIR` also `cost-<week>.md`, `.csv` and `.png` there.
Neither writes anything else. Bad input (no Prometheus, no database, an empty window, an
unknown model, a malformed week or time) is one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from apps.core.envnames import env_name
from apps.core.sizing.plan import plan_fleet
from apps.core.spec import StackSpec, load_spec
from apps.ops.promapi import OpsError, Prometheus
from apps.ops.settings import OpsSettings
from apps.ops.window import iso_week, window


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="job", required=True)
    drift = sub.add_parser("drift", help="ledger settled tokens vs vllm:generation_tokens for a window")
    drift.add_argument("--from", dest="start", required=True, help="ISO 8601, now, today, yesterday, -24h")
    drift.add_argument("--to", dest="end", required=True, help="ISO 8601, now, today, yesterday, -24h")
    drift.add_argument("--push-gateway", help="Pushgateway URL to export the result to")
    cost = sub.add_parser(
        "cost-report", help="weekly GPU hours, tokens and cost per million tokens per model"
    )
    cost.add_argument("--week", required=True, help="ISO week, e.g. 2026-W49 (UTC)")
    cost.add_argument("--out", type=Path, help="directory for cost-<week>.md, .csv and .png")
    cost.add_argument("--step", type=float, default=300.0, help="sampling step in seconds (default 300)")
    env = OpsSettings()
    for p in (drift, cost):
        p.add_argument("--prometheus-url", default=env.prometheus_url)
        p.add_argument("--database-url", default=env.database_url)
        p.add_argument("--stack", default=env.stack)
        p.add_argument("--model", help="only this model (drift)" if p is drift else argparse.SUPPRESS)


def _inputs(args: argparse.Namespace) -> tuple[StackSpec, Prometheus, str]:
    spec = load_spec(args.stack)
    model = getattr(args, "model", None)
    if model is not None and model not in spec.models:
        raise OpsError(
            f"unknown model {model!r} (stack {spec.name}: {', '.join(spec.models)})", param="model"
        )
    if not args.database_url:
        name = env_name(OpsSettings, "database_url")
        raise OpsError(f"no ledger database: --database-url or {name}", param="database_url")
    return spec, Prometheus(args.prometheus_url), args.database_url


def run(args: argparse.Namespace) -> int:
    return _drift(args) if args.job == "drift" else _cost(args)


def _drift(args: argparse.Namespace) -> int:
    from apps.ops import drift

    start, end = window(args.start, args.end)
    spec, prom, db = _inputs(args)
    result = drift.measure(prom, db, start, end, args.model)
    limit = spec.alerting.ledger_drift_max
    print(f"window            {start.isoformat()} .. {end.isoformat()}")
    print(f"ledger tokens     {result.ledger_tokens} ({result.ledger_requests} settled requests)")
    print(f"engine tokens     {result.engine_tokens:.0f} (vllm:generation_tokens, {result.replicas} series)")
    print(f"drift             {result.ratio:.4%} (limit {limit:.2%})")
    if args.push_gateway:
        drift.push(result, args.push_gateway)
    return 1 if result.ratio > limit else 0


def _cost(args: argparse.Namespace) -> int:
    from apps.ops import cost

    start, end = iso_week(args.week)
    if args.step <= 0:
        raise OpsError("--step must be greater than 0", param="step")
    if args.out is not None and not args.out.is_dir():
        raise OpsError(f"--out: {args.out} is not a directory", param="out")
    spec, prom, db = _inputs(args)
    report = cost.gather(prom, db, spec, plan_fleet(spec), args.week, start, end, args.step)
    markdown = report.markdown()
    print(markdown, end="")
    if args.out is not None:
        (args.out / f"cost-{args.week}.md").write_text(markdown)
        (args.out / f"cost-{args.week}.csv").write_text(report.csv())
        (args.out / f"cost-{args.week}.png").write_bytes(cost.chart_png(report))
    return 0
