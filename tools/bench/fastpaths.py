"""Each `apps/netio` fast path on and off, side by side in one run (issue 14).

  .venv/bin/python -m tools.bench fastpaths [--rounds 3] [--streams 200] [--max-tokens 64]
      [--configs on,off,-uvicorn_chunk,...] [--out FILE]

A configuration is a value of `LLMFLEET_NETIO_FASTPATHS` (the gateway's and the orchestrators'
`netio_fastpaths` setting) for the whole platform: `on` (every fast
path), `off` (every write through the framework's public API) or `-<path>` (every path but that
one). Each round starts one platform per configuration (fresh processes: each reads the switch at
start-up) in a rotation whose first configuration moves by one each round, and runs one
direct/platform pair of `tools.bench platform` on it (N steady streams, the same ramp for all).
Per configuration the pairs of all rounds are pooled (percentiles over every sample). The ratio
columns compare each configuration with `on` of the same round (its neighbour in time), reported
as the median and the range over the rounds: the range is the noise the verdict has to beat.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Sequence
from pathlib import Path

from apps.core.envnames import env_name
from apps.gateway.settings import GatewaySettings
from apps.loadgen.transit import added
from apps.netio.fastpath import PATHS
from apps.orchestrator.settings import OrchestratorSettings
from tools.bench.common import machine
from tools.bench.platform import _direct, _platform_run, bench_platform
from tools.bench.platform_report import Run, pooled

DEFAULT_CONFIGS = ("on", "off", *(f"-{path}" for path in PATHS))


def switch_value(config: str) -> str:
    """The `LLMFLEET_NETIO_FASTPATHS` value of a configuration name."""
    if config in ("on", "off"):
        return config
    if config.startswith("-") and config[1:] in PATHS:
        return ",".join(path for path in PATHS if path != config[1:])
    raise ValueError(f"unknown configuration {config!r}: on, off or -<path> ({', '.join(PATHS)})")


def rotation(configs: Sequence[str], round_no: int) -> list[str]:
    """Round `round_no`'s order: the list shifted by one per round, so no configuration always runs
    first (right after a cold start of the machine's caches) or last."""
    k = round_no % len(configs)
    return [*configs[k:], *configs[:k]]


def _cpu_per_k(run: Run) -> float:
    return run.cpu_s / (run.tokens / 1000) if run.tokens else float("nan")


def _added(pair: tuple[Run, Run], what: str, q: str) -> float | None:
    direct, via = pair
    return added(via.report[what][q], direct.report[what][q])


def _one(config: str, streams: int, ramp_s: float, args: argparse.Namespace) -> tuple[Run, Run]:
    for settings in (GatewaySettings, OrchestratorSettings):  # the same name; each app reads its own
        os.environ[env_name(settings, "netio_fastpaths")] = switch_value(config)
    with bench_platform(args.speed) as (platform, procs):
        relay = [procs["gateway"], procs["orchestrator"], procs["agent"]]
        direct = _direct(platform, streams, args, ramp_s, "steady")
        return direct, _platform_run(platform, relay, streams, args, ramp_s, "steady", config)


def _ramp(args: argparse.Namespace) -> float:
    """One request's duration (a direct burst's E2E p50), as `tools.bench platform` spreads steady arrivals."""
    with bench_platform(args.speed) as (platform, _):
        burst = _direct(platform, args.streams, args, 0.0, "burst")
    return float(burst.report["e2e_ms"]["p50"] or 0.0) / 1000


def _fmt(v: float | None, digits: int = 1) -> str:
    return "n/a" if v is None or v != v else f"{v:.{digits}f}"


def _ratio_cell(values: list[float]) -> str:
    good = [v for v in values if v == v]
    if not good:
        return "n/a"
    return f"{statistics.median(good):.2f} ({min(good):.2f}-{max(good):.2f})"


def _table(configs: Sequence[str], by_config: dict[str, list[tuple[Run, Run]]]) -> list[str]:
    lines = [
        "| configuration | pooled added TTFT p50 / p99 ms | pooled added transit p50 / p99 ms | "
        "CPU s / 1k tokens per round | CPU vs `on` (median, range) | transit p50 vs `on` | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    on = by_config.get("on", [])
    for config in configs:
        pairs = by_config[config]
        pair = pooled(pairs)
        cpu = [_cpu_per_k(via) for _, via in pairs]
        cpu_ratio = [c / _cpu_per_k(o[1]) for c, o in zip(cpu, on, strict=False)]
        transit_ratio = [
            (_added(p, "transit_ms", "p50") or float("nan"))
            / (_added(o, "transit_ms", "p50") or float("nan"))
            for p, o in zip(pairs, on, strict=False)
        ]
        errors = sum(via.report["requests"]["error"] for _, via in pairs)
        lines.append(
            f"| `{config}` | {_fmt(_added(pair, 'ttft_ms', 'p50'))} / {_fmt(_added(pair, 'ttft_ms', 'p99'))} | "
            f"{_fmt(_added(pair, 'transit_ms', 'p50'))} / {_fmt(_added(pair, 'transit_ms', 'p99'))} | "
            f"{', '.join(_fmt(c, 3) for c in cpu)} | {_ratio_cell(cpu_ratio)} | {_ratio_cell(transit_ratio)} | "
            f"{errors} |"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--speed", type=float, default=1.0)
    parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGS))
    parser.add_argument("--out", type=Path, default=None, help="also write the page to this file")
    args = parser.parse_args(argv)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    for config in configs:
        switch_value(config)
    if "on" not in configs:
        parser.error("--configs must include on (the reference of the ratios)")
    ramp_s = _ramp(args)
    by_config: dict[str, list[tuple[Run, Run]]] = {c: [] for c in configs}
    for r in range(args.rounds):
        for config in rotation(configs, r):
            pair = _one(config, args.streams, ramp_s, args)
            by_config[config].append(pair)
            print(f"round {r + 1} {config}: CPU {_cpu_per_k(pair[1]):.3f} s/1k, added transit p50 "
                  f"{_fmt(_added(pair, 'transit_ms', 'p50'))} ms", flush=True)  # fmt: skip
    text = "\n".join(
        [
            "# Fast paths on/off (`python -m tools.bench fastpaths`)",
            "",
            *[f"- {k}: {v}" for k, v in machine().items()],
            f"- {args.rounds} rounds x {len(configs)} configurations, {args.streams} steady streams, ramp {ramp_s:.2f} s",
            "",
            *_table(configs, by_config),
            "",
        ]
    )
    if args.out is not None:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
