"""`llmfleet infra render --stack prod`: print every resource of the Pulumi program as JSON;
`llmfleet infra diff --stack prod [--base REV]`: what would change (infra/diff.py).

Runs the program under Pulumi mocks (no cloud account, no Pulumi CLI); secrets are masked.
`make render-golden` writes the output to `tests/fixtures/infra/<stack>.golden.json`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    render = sub.add_parser("render", help="print {type, name, inputs} of every resource as JSON")
    render.add_argument("--stack", default="dev", help="stack name (stacks/<name>.yaml) or path")
    diff = sub.add_parser("diff", help="+/~/- per resource against a git revision or the golden file")
    diff.add_argument("--stack", default="prod", help="stack name (stacks/<name>.yaml)")
    base = diff.add_mutually_exclusive_group()
    base.add_argument("--base", metavar="REV", help="git revision to compare with (default: the golden file)")
    base.add_argument(
        "--golden", type=Path, help="rendered snapshot (default tests/fixtures/infra/<stack>.golden.json)"
    )


def run(args: argparse.Namespace) -> int:
    from infra.render import render

    if args.action == "diff":
        return _diff(args)
    rows = render(args.stack)
    json.dump(rows, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


def _diff(args: argparse.Namespace) -> int:
    from infra.diff import diff_lines, golden_rows, rows_at_revision
    from infra.render import PROJECT_DIR, render

    head = render(args.stack)  # an unknown stack fails here, before any git work
    if args.base:
        base = rows_at_revision(args.base, args.stack)
        against = f"revision {args.base}"
    else:
        path = args.golden or PROJECT_DIR / "tests" / "fixtures" / "infra" / f"{args.stack}.golden.json"
        base = golden_rows(path)
        against = str(path)
    lines = diff_lines(base, head)
    for line in lines:
        print(line)
    counts = {sign: sum(1 for line in lines if line.startswith(sign)) for sign in "+~-"}
    print(
        f"stack {args.stack} against {against}: {counts['+']} to add, {counts['~']} to change, {counts['-']} to remove"
    )
    return 1 if lines else 0
