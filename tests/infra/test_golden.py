"""The rendered program equals the committed snapshot: the offline stand-in for `pulumi preview`."""

from __future__ import annotations

import difflib
import json
from pathlib import Path

from tests.infra.conftest import rendered

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "infra"


def dump(rows: object) -> str:
    # Same formatting as `llmfleet infra render`.
    return json.dumps(rows, indent=1, sort_keys=True) + "\n"


def test_render_matches_the_golden_snapshot(stack: str) -> None:
    path = GOLDEN_DIR / f"{stack}.golden.json"
    actual = dump(rendered(stack))
    expected = path.read_text(encoding="utf-8") if path.exists() else ""
    if actual != expected:
        diff = "".join(
            list(
                difflib.unified_diff(
                    expected.splitlines(keepends=True),
                    actual.splitlines(keepends=True),
                    str(path),
                    "rendered",
                    n=2,
                )
            )[:80]
        )
        raise AssertionError(
            f"the infrastructure of stack {stack!r} changed.\n"
            f"If the change is intended, run `make render-golden` and commit the reviewed diff of {path.name}.\n"
            f"First lines of the diff:\n{diff}"
        )


def test_render_is_deterministic(stack: str) -> None:
    from infra.render import render

    assert dump(render(stack)) == dump(rendered(stack))
