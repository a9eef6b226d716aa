"""`make test`: every CI stage in order, each as `make <stage>`, stopping at the first red one.

After each stage it prints one line (name, result, passed, failed, skipped, errors, seconds) and at
the end a table of every stage. The pytest stages write a JUnit XML report (`make <stage>
JUNIT_DIR=DIR` -> `DIR/<stage>.xml`) that the counts are read from; the other stages (lint,
typecheck...) have only a result and a duration. The stages that exist to run what the others
cannot (real vLLM, the browser, a real Prometheus, promtool, chaos) are red when any of their tests
was skipped, naming the tests and why: a green run then means those tests really ran. pytest's
own output (its closing line included) goes through untouched.

    python3.11 tools/test_stages.py [--junit-dir DIR] [--make MAKE] [STAGE ...] [-- VAR=VALUE ...]

Standard library only: it runs before the venv exists (the venv is made by the stages' `make`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Stage:
    name: str
    pytest: bool = False  # writes a JUnit report: counts come from it
    no_skips: bool = False  # a skipped test makes the stage red


# `make test`'s stages, in the order they run.
STAGES = (
    Stage("lock-check"),
    Stage("lint"),
    Stage("typecheck"),
    Stage("imports"),
    Stage("unit", pytest=True),
    Stage("rules", pytest=True, no_skips=True),
    Stage("observability", pytest=True, no_skips=True),
    Stage("browser", pytest=True, no_skips=True),
    Stage("realvllm", pytest=True, no_skips=True),
    Stage("chaos", pytest=True, no_skips=True),
    Stage("infra-diff"),
)


@dataclass(frozen=True)
class Skip:
    test: str
    reason: str


@dataclass
class Counts:
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    errors: int = 0
    skips: list[Skip] = field(default_factory=list)


@dataclass(frozen=True)
class Result:
    stage: Stage
    ran: bool
    ok: bool
    seconds: float
    counts: Counts | None
    problem: str = ""  # why a red stage is red


def read_junit(path: Path) -> Counts:
    """The outcome counts of a pytest JUnit XML report (every `<testsuite>` in it)."""
    root = ET.parse(path).getroot()  # our own pytest's report, not untrusted input
    counts = Counts()
    for case in root.iter("testcase"):
        if case.find("failure") is not None:
            counts.failed += 1
        elif case.find("error") is not None:
            counts.errors += 1
        elif (skipped := case.find("skipped")) is not None:
            counts.skipped += 1
            name = f"{case.get('classname', '')}::{case.get('name', '')}".strip(":")
            counts.skips.append(Skip(name, skipped.get("message", "") or skipped.get("type", "")))
        else:
            counts.passed += 1
    return counts


def dry_run(makeflags: str) -> bool:
    """`make -n test`: GNU make's MAKEFLAGS then starts with its one-letter flags, `n` among them."""
    first = makeflags.split(" ", 1)[0]
    return not first.startswith("-") and "n" in first


def judge(stage: Stage, returncode: int, counts: Counts | None, *, dry: bool = False) -> tuple[bool, str]:
    """(green?, why not) for a stage that exited with `returncode` and reported `counts` (`dry`:
    `make -n`, which runs no test and writes no report)."""
    if returncode != 0:
        return False, f"`make {stage.name}` exited with {returncode}"
    if stage.pytest and counts is None and not dry:
        return False, f"`make {stage.name}` wrote no JUnit report: its counts are unknown"
    if stage.no_skips and counts is not None and counts.skips:
        listed = "".join(f"\n    {s.test}: {s.reason}" for s in counts.skips)
        return False, (
            f"stage {stage.name} must run every test, but {len(counts.skips)} "
            f"{'was' if len(counts.skips) == 1 else 'were'} skipped:{listed}"
        )
    return True, ""


def _counts_text(counts: Counts | None) -> str:
    if counts is None:
        return "no test counts"
    return f"{counts.passed} passed, {counts.failed} failed, {counts.skipped} skipped, {counts.errors} errors"


def stage_line(result: Result) -> str:
    """The line printed when a stage ends."""
    verdict = "ok" if result.ok else "FAILED"
    line = (
        f"== stage {result.stage.name}: {verdict}, {_counts_text(result.counts)}, {result.seconds:.1f} s =="
    )
    return f"{line}\n   {result.problem}" if result.problem else line


def table(results: Sequence[Result], stages: Sequence[Stage]) -> str:
    """Every stage, run or not, with its counts and duration."""
    by_name = {r.stage.name: r for r in results}
    header = ("stage", "result", "passed", "failed", "skipped", "errors", "seconds")
    rows: list[tuple[str, ...]] = [header]
    for stage in stages:
        r = by_name.get(stage.name)
        if r is None:
            rows.append((stage.name, "not run", "", "", "", "", ""))
            continue
        c = r.counts
        numbers = (c.passed, c.failed, c.skipped, c.errors) if c else None
        cells = tuple(str(n) for n in numbers) if numbers else ("-", "-", "-", "-")
        rows.append((stage.name, "ok" if r.ok else "FAILED", *cells, f"{r.seconds:.1f}"))
    total = sum(r.seconds for r in results)
    rows.append(("total", "ok" if all(r.ok for r in results) else "FAILED", "", "", "", "", f"{total:.1f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for row in rows:
        aligned = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
        aligned += [cell.rjust(widths[i]) for i, cell in enumerate(row) if i >= 2]
        lines.append("  ".join(aligned).rstrip())
    return "\n".join(lines)


Runner = Callable[[Sequence[str]], int]


def run_stage(
    stage: Stage, make: Sequence[str], junit_dir: Path, runner: Runner, clock: Callable[[], float]
) -> Result:
    report = junit_dir / f"{stage.name}.xml"
    report.unlink(missing_ok=True)  # never read an earlier run's counts
    start = clock()
    returncode = runner([*make, stage.name, f"JUNIT_DIR={junit_dir}"])
    seconds = clock() - start
    counts = read_junit(report) if stage.pytest and report.exists() else None
    ok, problem = judge(stage, returncode, counts, dry=dry_run(os.environ.get("MAKEFLAGS", "")))
    return Result(stage, True, ok, seconds, counts, problem)


def run_stages(
    stages: Sequence[Stage],
    make: Sequence[str],
    junit_dir: Path,
    runner: Runner,
    clock: Callable[[], float] = time.monotonic,
    out: Callable[[str], None] = print,
    results: list[Result] | None = None,
) -> list[Result]:
    """Run `stages` in order until one is red; print a line after each. Each result is appended
    to `results` (a new list by default) as soon as its stage ends."""
    results = [] if results is None else results
    for stage in stages:
        out(f"== stage {stage.name} ==")
        result = run_stage(stage, make, junit_dir, runner, clock)
        results.append(result)
        out(stage_line(result))
        if not result.ok:
            break
    return results


def _run(argv: Sequence[str]) -> int:
    sys.stdout.flush()
    return subprocess.run(argv, check=False).returncode


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    make_vars: list[str] = []
    if "--" in args:
        make_vars = args[args.index("--") + 1 :]
        args = args[: args.index("--")]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--junit-dir", type=Path, default=Path("artifacts/junit"))
    parser.add_argument("--make", default=os.environ.get("MAKE", "make"))
    parser.add_argument("stages", nargs="*", help="a subset of the stages (default: all, in order)")
    opts = parser.parse_args(args)
    known = {s.name: s for s in STAGES}
    unknown = [name for name in opts.stages if name not in known]
    if unknown:
        parser.error(f"unknown stage(s) {', '.join(unknown)}; stages: {', '.join(known)}")
    stages = [known[name] for name in opts.stages] if opts.stages else list(STAGES)
    junit_dir = opts.junit_dir.resolve()
    junit_dir.mkdir(parents=True, exist_ok=True)
    make = [opts.make, "--no-print-directory", *make_vars]
    results: list[Result] = []
    try:
        run_stages(stages, make, junit_dir, _run, out=lambda line: print(line, flush=True), results=results)
    except KeyboardInterrupt:
        print("\n" + table(results, stages) + "\n\nmake test: interrupted", flush=True)
        return 130
    print("\n" + table(results, stages), flush=True)
    failed = [r for r in results if not r.ok]
    if failed:
        print(f"\nmake test: FAILED at stage {failed[0].stage.name}: {failed[0].problem}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
