"""`llmfleet plan`: print a stack's capacity plan as a table or JSON, with what-if overrides."""

from __future__ import annotations

import argparse
import json

from apps.core.errors import SpecError
from apps.core.sizing.plan import plan_fleet, with_overrides
from apps.core.sizing.pools import check_pool_caps, pool_demand
from apps.core.spec import load_spec
from apps.planner.render import render_plan


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--stack", default="prod", help="stack name (stacks/<name>.yaml) or a path to a spec file"
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    what_if = parser.add_argument_group("what-if (the spec file is not changed)")
    what_if.add_argument(
        "--streams",
        action="append",
        default=[],
        metavar="MODEL=N",
        help="peak concurrent streams of a model (an embedding model: inputs in flight)",
    )
    what_if.add_argument("--gpu-type", help="plan every model on this GPU type of the spec")
    what_if.add_argument(
        "--context",
        type=int,
        metavar="TOKENS",
        help="planning context length for every model (an embedding model: tokens per input)",
    )
    what_if.add_argument(
        "--prefix-hit-rate",
        type=float,
        metavar="RATE",
        help="share of prompt tokens cached, every generate model (0..1)",
    )


def _parse_streams(items: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not value.strip().isdigit():
            raise SpecError(
                f"--streams: expected MODEL=N with N a whole number, got {item!r}", param="streams"
            )
        out[name.strip()] = int(value)
    return out


def run(args: argparse.Namespace) -> int:
    spec = load_spec(args.stack)
    if args.streams or args.gpu_type or args.context is not None or args.prefix_hit_rate is not None:
        spec = with_overrides(
            spec,
            peak_streams=_parse_streams(args.streams),
            gpu_type=args.gpu_type,
            context_tokens=args.context,
            prefix_hit_rate=args.prefix_hit_rate,
        )
    plan = plan_fleet(spec)
    pools = pool_demand(spec, plan)
    check_pool_caps(pools)
    if args.json:
        out = plan.to_json()
        out["gpu_pools"] = {d.pool: {"gpus": d.gpus, "cap": d.cap, "per_model": d.per_model} for d in pools}
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        print(render_plan(plan))
        for d in pools:
            cap = "no cap" if d.cap is None else f"cap {d.cap}, headroom {d.headroom}"
            print(f"NodePool {d.pool}: nvidia.com/gpu limit {d.gpus} at the replica maxima ({cap})")
    return 0
