"""`llmfleet infra render --stack prod`: print every resource of the Pulumi program as JSON.

Runs the program under Pulumi mocks (no cloud account, no Pulumi CLI); secrets are masked.
`make render-golden` writes the output to `tests/fixtures/infra/<stack>.golden.json`.
"""

from __future__ import annotations

import argparse
import json
import sys


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    render = sub.add_parser("render", help="print {type, name, inputs} of every resource as JSON")
    render.add_argument("--stack", default="dev", help="stack name (stacks/<name>.yaml) or path")


def run(args: argparse.Namespace) -> int:
    from infra.render import render

    rows = render(args.stack)
    json.dump(rows, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0
