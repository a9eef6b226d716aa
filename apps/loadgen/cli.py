"""`llmfleet loadgen`: drive an OpenAI-compatible endpoint and print a table (or `--json`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from apps.core.envnames import env_name
from apps.loadgen.config import LoadConfig
from apps.loadgen.runner import Progress, run_load
from apps.loadgen.settings import LoadgenSettings
from apps.loadgen.trace import write_trace


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000/v1")
    parser.add_argument(
        "--api-key",
        default=LoadgenSettings().api_key,
        help=f"sent as `Authorization: Bearer KEY` (default: env {env_name(LoadgenSettings, 'api_key')}, else none)",
    )
    parser.add_argument("--model", required=True)
    parser.add_argument("--concurrency", type=int, default=1, help="streams in flight (open loop: the cap)")
    stop = parser.add_mutually_exclusive_group()
    stop.add_argument("--requests", type=int, help="total requests (default: one per stream)")
    stop.add_argument("--duration", type=float, help="seconds to keep sending")
    parser.add_argument("--rate", type=float, help="open loop: Poisson arrivals per second")
    parser.add_argument(
        "--ramp",
        type=float,
        default=0.0,
        help="closed loop: spread the streams' starts over SECONDS (steady arrivals)",
    )
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--abandon-after", type=int, help="drop each stream after K chunks (leak tests)")
    parser.add_argument("--no-ignore-eos", action="store_true", help="do not send ignore_eos: true")
    parser.add_argument("--timeout", type=float, default=300.0, help="per-request timeout, seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tag", help='send `user: "TAG-<index>"` in each request (joins with an engine\'s timing log)'
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    parser.add_argument(
        "--record-trace", metavar="FILE", help="write the run as a trace for `llmfleet simulate`"
    )


def _progress_printer(total_hint: str) -> object:
    def show(p: Progress) -> None:
        width = 30
        if p.total:
            filled = int(width * p.done / p.total)
            bar = "#" * filled + "." * (width - filled)
            head = f"[{bar}] {p.done}/{p.total}"
        else:
            head = f"{p.done} done ({total_hint})"
        rate = p.output_tokens / p.elapsed_s if p.elapsed_s > 0 else 0.0
        line = (
            f"\r{head}  in flight {p.in_flight}  errors {p.errors}  {rate:,.0f} tok/s  {p.elapsed_s:5.1f} s"
        )
        sys.stderr.write(line)
        sys.stderr.flush()

    return show


def run(args: argparse.Namespace) -> int:
    config = LoadConfig(
        base_url=args.base_url,
        model=args.model,
        api_key=args.api_key,
        concurrency=args.concurrency,
        requests=args.requests,
        duration_s=args.duration,
        rate=args.rate,
        ramp_s=args.ramp,
        prompt_tokens=args.prompt_tokens,
        max_tokens=args.max_tokens,
        abandon_after=args.abandon_after,
        ignore_eos=not args.no_ignore_eos,
        request_timeout_s=args.timeout,
        seed=args.seed,
        tag=args.tag,
    ).validate()
    on_progress = None
    if sys.stderr.isatty():
        on_progress = _progress_printer(f"{args.duration:g} s" if args.duration else "")
    report = asyncio.run(run_load(config, on_progress))  # type: ignore[arg-type]
    if on_progress is not None:
        sys.stderr.write("\n")
    if args.record_trace:
        write_trace(args.record_trace, report, config)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.table())
    return 0
