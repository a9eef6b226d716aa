"""`make lock-check` (tools/lock.py): CI fails when pyproject.toml's dependencies change without `make lock`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tools.lock import LOCK_NAME, STAMP_PREFIX, check, deps_digest, stamped

ROOT = Path(__file__).resolve().parents[2]


def _copy(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copy(ROOT / LOCK_NAME, tmp_path / LOCK_NAME)
    return tmp_path


def test_the_committed_lock_is_current() -> None:
    assert check(ROOT) is None


def test_a_new_dependency_without_make_lock_fails_with_the_command_to_run(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    pyproject = root / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text().replace('  "pyyaml>=6",\n', '  "pyyaml>=6",\n  "jinja2>=3",\n')
    )
    problem = check(root)
    assert problem is not None
    assert "stale" in problem
    assert "make lock" in problem


def test_a_changed_bound_fails_but_a_comment_or_tool_setting_does_not(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    pyproject = root / "pyproject.toml"
    text = pyproject.read_text()
    pyproject.write_text(text + "\n# a comment\n[tool.example]\nx = 1\n")
    assert check(root) is None
    pyproject.write_text(text.replace('"aiohttp>=3.10,<3.15"', '"aiohttp>=3.10,<3.16"'))
    assert check(root) is not None


def test_missing_or_unstamped_lock_fails(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    lock = root / LOCK_NAME
    lock.write_text("".join(line for line in lock.read_text().splitlines(True) if STAMP_PREFIX not in line))
    assert "make lock" in (check(root) or "")
    lock.unlink()
    assert "missing" in (check(root) or "")


def test_stamp_goes_after_uv_header_once() -> None:
    text = "# header\n#    make lock\na==1\n    # via b\n"
    once = stamped(text, "abc")
    assert stamped(once, "abc") == once
    assert once.splitlines()[2] == STAMP_PREFIX + "abc"
    assert once.splitlines()[3] == "a==1"


def test_check_command_exits_1_with_one_line(tmp_path: Path) -> None:
    assert deps_digest(ROOT / "pyproject.toml") in (ROOT / LOCK_NAME).read_text()
    ok = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "lock.py"), "check"], capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr
    usage = subprocess.run([sys.executable, str(ROOT / "tools" / "lock.py")], capture_output=True, text=True)
    assert usage.returncode == 2
