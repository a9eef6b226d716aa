"""tools/bench: one entry point whose benchmarks all start, and no tool imports `tests`."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tools.bench import hotpath
from tools.bench.__main__ import BENCHMARKS

ROOT = Path(__file__).resolve().parents[2]


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", sorted((ROOT / "tools").rglob("*.py")), ids=lambda p: p.name)
def test_no_tool_imports_tests(path: Path) -> None:
    assert not {n for n in _imported(path) if n == "tests" or n.startswith("tests.")}


def test_every_benchmark_module_exists_and_is_listed() -> None:
    modules = {p.stem for p in (ROOT / "tools" / "bench").glob("*.py")}
    assert set(BENCHMARKS) <= modules
    helpers = {
        "__init__",
        "__main__",
        "common",
        "wire",
        "platform_report",
        "vllm_nodes",
        "cache_client",
        "cache_report",
    }
    assert modules - set(BENCHMARKS) == helpers


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_each_benchmark_parses_its_options(name: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tools.bench", name, "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "usage:" in out.stdout


def test_unknown_benchmark_is_exit_2_with_the_list() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tools.bench", "nope"], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 2
    assert all(name in out.stderr for name in BENCHMARKS)


def _failed_load(base: str, key: str, streams: int, max_tokens: int, prompt: int) -> dict[str, object]:
    return {"output_tokens": 0, "requests": {"ok": 0, "error": streams}}


def test_hotpath_round_where_every_request_failed_is_reported_not_divided_by(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Was ZeroDivisionError: CPU seconds / (0 tokens / 1000).
    def measure(max_tokens: int) -> dict[str, object]:
        return hotpath._round("http://x/v1", "k", {}, 4, max_tokens, load_fn=_failed_load)

    assert hotpath.run_rounds(measure, [64], 2) == 1
    err = capsys.readouterr().err
    assert "relayed no tokens" in err
    assert "4 request(s) failed" in err


def test_hotpath_rounds_print_rows_and_medians(capsys: pytest.CaptureFixture[str]) -> None:
    rows = iter(
        [{"tokens": 10, "gateway": 0.3}, {"tokens": 10, "gateway": 0.1}, {"tokens": 10, "gateway": 0.2}]
    )
    assert hotpath.run_rounds(lambda m: {"max_tokens": m, **next(rows)}, [64], 3) == 0
    assert 'median CPU s per 1,000 tokens: {"gateway": 0.2}' in capsys.readouterr().out
