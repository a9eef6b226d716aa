"""`llmfleet simulate`: run a load trace or a built-in profile through the simulated fleet.

    llmfleet simulate --profile brief-peak --stack prod
    llmfleet simulate --trace run.jsonl --json
    llmfleet simulate --profile office-day --plot day.png --seed 3

Bad input (unknown profile, a malformed trace line, a model the stack does not serve) is one
line on stderr and exit status 2 (`apps.cli.main` turns the `SpecError` into it).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from apps.core.errors import SpecError
from apps.simulate.report import plot, summary, table
from apps.simulate.sim import Settings, Simulation
from apps.simulate.trace import PROFILES, TraceRequest, generate, load_trace, profile
from apps.simulate.world import World, build_world, check_models, what_if


def configure(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--trace", help="trace file (JSON lines or CSV), e.g. from `llmfleet loadgen --record-trace`"
    )
    src.add_argument("--profile", help=f"built-in load: {', '.join(sorted(PROFILES))}")
    parser.add_argument(
        "--stack", default="prod", help="stack spec (stacks/<stack>.yaml and Pulumi.<stack>.yaml)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for arrivals, node launches, interruptions")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument(
        "--plot", metavar="FILE.png", help="replicas, queue and TTFT over time (needs matplotlib)"
    )
    parser.add_argument(
        "--onprem", default="auto", help="model the on-premises servers run: auto, none or a name"
    )
    parser.add_argument(
        "--node-launch-s", default="60:180", help="node launch latency, uniform LO:HI seconds"
    )
    parser.add_argument("--s3-gib-per-s", type=float, default=0.5, help="model sync bandwidth from S3")
    parser.add_argument("--nvme-gib-per-s", type=float, default=2.0, help="weight load bandwidth from NVMe")
    parser.add_argument("--engine-start-s", type=float, default=60.0, help="vLLM start-up after the weights")
    parser.add_argument("--spot-interruptions-per-hour", type=float, default=0.0, help="per spot node")
    parser.add_argument(
        "--scaled-objects", metavar="RENDER.json", help="what-if: another render's ScaledObjects"
    )
    parser.add_argument("--gpu-limit", type=int, help="what-if: every GPU NodePool's limit")
    parser.add_argument("--start", help="wall time of t=0 (ISO, UTC) for the cron triggers; profiles set one")
    parser.add_argument(
        "--prefix-hit-rate",
        type=float,
        help="share of prompt tokens found in the prefix cache, every model (default: each model's "
        "serving.prefix_hit_rate in the stack)",
    )


def _launch(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(":"))
    except ValueError:
        raise SpecError(f"--node-launch-s: want LO:HI seconds, got {text!r}", param="node_launch_s") from None
    if not 0 <= lo <= hi:
        raise SpecError(f"--node-launch-s: want 0 <= LO <= HI, got {text!r}", param="node_launch_s")
    return lo, hi


def _load(args: argparse.Namespace, world: World) -> tuple[list[TraceRequest], datetime]:
    if args.profile is not None:
        prof = profile(args.profile)
        service = {m: p.queue.service_time_s for m, p in world.plan.models.items()}
        start = _profile_start(prof.start_weekday, prof.start_hour, world.infra.office_hours.timezone)
        return generate(prof, service, args.seed), start
    rows = load_trace(args.trace)
    return rows, datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def _profile_start(weekday: int, hour: float, timezone: str) -> datetime:
    """The first `weekday` at `hour` local time on or after 2026-11-30 (a Monday)."""
    local = datetime(2026, 11, 30, tzinfo=ZoneInfo(timezone)) + timedelta(days=weekday, hours=hour)
    return local.astimezone(UTC)


def settings(args: argparse.Namespace, world: World, start: datetime) -> Settings:
    onprem = None if args.onprem == "none" else args.onprem
    if onprem not in (None, "auto") and onprem not in world.spec.models:
        raise SpecError(f"--onprem: stack {world.spec.name!r} has no model {onprem!r}", param="onprem")
    if args.prefix_hit_rate is not None and not 0 <= args.prefix_hit_rate <= 1:
        raise SpecError(f"--prefix-hit-rate: want 0..1, got {args.prefix_hit_rate}", param="prefix_hit_rate")
    if args.start:
        try:
            start = datetime.fromisoformat(args.start).replace(tzinfo=UTC)
        except ValueError:
            raise SpecError(f"--start: not an ISO date-time: {args.start!r}", param="start") from None
    return Settings(
        seed=args.seed,
        node_launch_s=_launch(args.node_launch_s),
        engine_start_s=args.engine_start_s,
        s3_gib_per_s=args.s3_gib_per_s,
        nvme_gib_per_s=args.nvme_gib_per_s,
        spot_interruptions_per_node_hour=args.spot_interruptions_per_hour,
        onprem_model=onprem,
        start=start,
        prefix_hit_rate=args.prefix_hit_rate,
    )


def run(args: argparse.Namespace) -> int:
    world = what_if(build_world(args.stack), scaled_objects=args.scaled_objects, gpu_limit=args.gpu_limit)
    trace, start = _load(args, world)
    check_models(world, {r.model for r in trace})
    sim = Simulation(world, trace, settings(args, world, start))
    rec = sim.run()
    result = summary(rec)
    if args.plot:
        try:
            plot(rec, args.plot)
        except ImportError:
            raise SpecError(
                "--plot needs matplotlib: pip install 'llmfleet[simulate]'", param="plot"
            ) from None
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        print(table(result))
    return 0
