"""`llmfleet ops drift --from --to`, `llmfleet ops cost-report --week YYYY-Www` and `llmfleet ops audit`.

drift: prints the ledger's settled completion tokens, the engines' `vllm:generation_tokens`
increase and the drift; exit 1 above the stack's `alerting.ledger_drift_max`; with
`--push-gateway` the result is also pushed as `llmfleet_ledger_drift_ratio`.
cost-report: Markdown on stdout; with `--out DIR` also `cost-<week>.md`, `.csv` and `.png` there.
audit: `--request-id ID`, or `--team T [--from --to]`: who, which key, which model revision, which
node, tokens and cost per request, never content (`apps/ops/audit.py`).
None writes anything else. Bad input (no Prometheus, no database, an empty window, an
unknown model, a malformed week or time) is one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import sys
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
    audit = sub.add_parser(
        "audit", help="per request: team, key, model revision, node, tokens and cost (never content)"
    )
    audit.add_argument(
        "--request-id", help="one request: its ledger id, or with --team the x-request-id its client chose"
    )
    audit.add_argument("--team", help="every request of a team (name or id) reserved in --from .. --to")
    audit.add_argument("--from", dest="start", default="-24h", help="with --team (default -24h)")
    audit.add_argument("--to", dest="end", default="now", help="with --team (default now)")
    audit.add_argument("--limit", type=int, default=1000, help="rows at most with --team (default 1000)")
    audit.add_argument("--json", action="store_true", help="one JSON object per row")
    env = OpsSettings()
    for p in (drift, cost, audit):
        p.add_argument("--database-url", default=env.database_url)
    for p in (drift, cost):
        p.add_argument("--prometheus-url", default=env.prometheus_url)
        p.add_argument("--stack", default=env.stack)
        p.add_argument("--model", help="only this model (drift)" if p is drift else argparse.SUPPRESS)


def _database_url(args: argparse.Namespace) -> str:
    if not args.database_url:
        name = env_name(OpsSettings, "database_url")
        raise OpsError(f"no ledger database: --database-url or {name}", param="database_url")
    return str(args.database_url)


def _inputs(args: argparse.Namespace) -> tuple[StackSpec, Prometheus, str]:
    spec = load_spec(args.stack)
    model = getattr(args, "model", None)
    if model is not None and model not in spec.models:
        raise OpsError(
            f"unknown model {model!r} (stack {spec.name}: {', '.join(spec.models)})", param="model"
        )
    return spec, Prometheus(args.prometheus_url), _database_url(args)


def run(args: argparse.Namespace) -> int:
    jobs = {"drift": _drift, "cost-report": _cost, "audit": _audit}
    return jobs[args.job](args)


def _audit(args: argparse.Namespace) -> int:
    from apps.ops import audit

    if args.request_id is not None:
        rows, more = [audit.by_request(_database_url(args), args.request_id, args.team)], False
    elif args.team is None:
        raise OpsError("audit: --request-id ID, or --team T (with --from/--to)", param="request_id")
    else:
        if args.limit <= 0:
            raise OpsError("--limit must be greater than 0", param="limit")
        start, end = window(args.start, args.end)
        rows, more = audit.by_team(_database_url(args), args.team, start, end, args.limit)
    print(audit.json_lines(rows) if args.json else audit.table(rows))
    if more:
        print(
            f"more than {args.limit} requests matched: narrow --from/--to or raise --limit", file=sys.stderr
        )
    return 0


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
