"""`llmfleet infra diff --stack prod [--base REV | --golden FILE]`: what `pulumi preview` would say.

Compares the program's render now with its render at a git revision (`--base`, rendered from
`git archive REV` in a temporary directory) or with the committed golden snapshot (default).
One line per resource: `+` added, `-` removed, `~` changed with the changed input paths; secrets
are masked by the renderer. Exit 0: no changes, 1: changes, 2: error (one line on stderr).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path
from typing import Any

from apps.core.errors import LlmfleetError
from infra.render import PROJECT_DIR

Rows = list[dict[str, Any]]
Key = tuple[str, str]


class InfraDiffError(LlmfleetError):
    code = "infra_diff_failed"


def changed_paths(old: Any, new: Any, path: str = "") -> list[str]:
    """Dotted paths of the leaves that differ (a list of another length counts as one change)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in sorted(set(old) | set(new)):
            sub = f"{path}.{k}" if path else str(k)
            out += [sub] if (k in old) != (k in new) else changed_paths(old[k], new[k], sub)
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [
            p
            for i, (a, b) in enumerate(zip(old, new, strict=True))
            for p in changed_paths(a, b, f"{path}[{i}]")
        ]
    return [] if old == new else [path or "."]


def diff_lines(base: Rows, head: Rows) -> list[str]:
    def index(rows: Rows) -> dict[Key, dict[str, Any]]:
        return {
            (r["type"], r["name"]): {k: v for k, v in r.items() if k not in ("type", "name")} for r in rows
        }

    old, new = index(base), index(head)
    lines: list[str] = []
    for key in sorted(set(old) | set(new)):
        typ, name = key
        if key not in old:
            lines.append(f"+ {typ} {name}")
        elif key not in new:
            lines.append(f"- {typ} {name}")
        elif paths := changed_paths(old[key], new[key]):
            lines.append(f"~ {typ} {name}: {', '.join(paths)}")
    return lines


def golden_rows(path: Path) -> Rows:
    try:
        rows: Rows = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InfraDiffError(f"{path}: cannot read golden file: {exc.strerror}", param="golden") from None
    except json.JSONDecodeError as exc:
        raise InfraDiffError(
            f"{path}: not a rendered snapshot (invalid JSON: {exc.msg})", param="golden"
        ) from None
    if not isinstance(rows, list):
        raise InfraDiffError(f"{path}: not a rendered snapshot (expected a JSON list)", param="golden")
    return rows


def rows_at_revision(rev: str, stack: str) -> Rows:
    """Render `stack` from the tree of git revision `rev` (with this interpreter and its packages)."""
    archive = subprocess.run(
        ["git", "-C", str(PROJECT_DIR), "archive", "--format=tar", rev], capture_output=True, check=False
    )
    if archive.returncode != 0:
        raise InfraDiffError(f"--base {rev}: not a revision of this repository", param="base")
    with tempfile.TemporaryDirectory(prefix="llmfleet-diff-") as tmp:
        with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
            tar.extractall(tmp, filter="data")
        done = subprocess.run(
            [sys.executable, "-m", "apps.cli.main", "infra", "render", "--stack", stack],
            cwd=tmp,
            env={"PYTHONPATH": tmp, "PATH": "/usr/bin:/bin", "HOME": tmp},
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise InfraDiffError(f"--base {rev}: the program does not render there: {last}", param="base")
    rows: Rows = json.loads(done.stdout)
    return rows
