"""`make test`'s stage runner (tools/test_stages.py): counts from pytest's own JUnit reports, a
line per stage, a table, fail-fast, and a skip in a must-run stage is red with the tests named."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tools.test_stages import (
    STAGES,
    Counts,
    Result,
    Skip,
    Stage,
    dry_run,
    judge,
    main,
    read_junit,
    run_stages,
    table,
)

ROOT = Path(__file__).resolve().parents[2]

SAMPLE = """
import pytest

def test_passes():
    assert True

def test_fails():
    assert 1 == 2

@pytest.mark.skip(reason="no chromium here")
def test_skipped():
    pass

@pytest.fixture
def broken():
    raise RuntimeError("fixture")

def test_errors(broken):
    pass

class TestGroup:
    def test_skips_inside(self):
        pytest.skip("real vLLM not installed")
"""


@pytest.fixture(scope="module")
def sample_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A JUnit report written by pytest itself for a file with every outcome."""
    work = tmp_path_factory.mktemp("junit")
    (work / "test_sample.py").write_text(SAMPLE)
    report = work / "sample.xml"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={report}",
            "test_sample.py",
        ],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stdout + done.stderr  # a test failed
    return report


def test_counts_come_from_pytests_own_report(sample_report: Path) -> None:
    counts = read_junit(sample_report)
    assert (counts.passed, counts.failed, counts.skipped, counts.errors) == (1, 1, 2, 1)
    assert [s.test for s in counts.skips] == [
        "test_sample::test_skipped",
        "test_sample.TestGroup::test_skips_inside",
    ]
    assert "no chromium here" in counts.skips[0].reason
    assert "real vLLM not installed" in counts.skips[1].reason


def _skipped(n: int) -> Counts:
    skips = [Skip(f"tests/t.py::test_{i}", f"reason {i}") for i in range(n)]
    return Counts(passed=3, skipped=n, skips=skips)


def test_a_skip_in_a_must_run_stage_is_red_and_names_the_tests() -> None:
    ok, problem = judge(Stage("realvllm", pytest=True, no_skips=True), 0, _skipped(2))
    assert not ok
    assert "realvllm must run every test, but 2 were skipped" in problem
    assert "tests/t.py::test_0: reason 0" in problem
    assert "tests/t.py::test_1: reason 1" in problem


def test_a_skip_elsewhere_is_counted_but_green() -> None:
    assert judge(Stage("unit", pytest=True), 0, _skipped(1)) == (True, "")
    assert judge(Stage("chaos", pytest=True, no_skips=True), 0, _skipped(0)) == (True, "")


def test_a_failing_make_or_a_missing_report_is_red() -> None:
    assert judge(Stage("lint"), 2, None) == (False, "`make lint` exited with 2")
    assert judge(Stage("lint"), 0, None) == (True, "")
    ok, problem = judge(Stage("unit", pytest=True), 0, None)
    assert not ok
    assert "no JUnit report" in problem


class FakeMake:
    """Stands in for `make <stage>`: writes the stage's report and exits with the scripted code."""

    def __init__(self, outcomes: dict[str, tuple[int, str | None]]) -> None:
        self.outcomes = outcomes
        self.calls: list[Sequence[str]] = []

    def __call__(self, argv: Sequence[str]) -> int:
        self.calls.append(argv)
        stage = argv[-2]
        junit_dir = Path(argv[-1].removeprefix("JUNIT_DIR="))
        returncode, xml = self.outcomes.get(stage, (0, None))
        if xml is not None:
            (junit_dir / f"{stage}.xml").write_text(xml)
        return returncode


def _xml(passed: int, skipped: Sequence[str] = ()) -> str:
    cases = [f'<testcase classname="tests.t" name="test_{i}" time="0.1"/>' for i in range(passed)]
    cases += [
        f'<testcase classname="tests.t" name="{name}" time="0"><skipped type="pytest.skip" message="why"/></testcase>'
        for name in skipped
    ]
    return f'<testsuites><testsuite name="pytest">{"".join(cases)}</testsuite></testsuites>'


def _ticks() -> Iterator[float]:
    t = 0.0
    while True:
        yield t
        t += 1.5


STAGES_UNDER_TEST = (
    Stage("lint"),
    Stage("unit", pytest=True),
    Stage("browser", pytest=True, no_skips=True),
    Stage("infra-diff"),
)


def test_every_stage_gets_a_line_and_the_run_stops_at_the_first_red_one(tmp_path: Path) -> None:
    make = FakeMake({"unit": (0, _xml(4, ["test_x"])), "browser": (0, _xml(2, ["test_console"]))})
    lines: list[str] = []
    ticks = _ticks()
    results = run_stages(STAGES_UNDER_TEST, ["make"], tmp_path, make, lambda: next(ticks), lines.append)
    assert [call[1] for call in make.calls] == ["lint", "unit", "browser"]  # infra-diff never ran
    assert all(call[2] == f"JUNIT_DIR={tmp_path}" for call in make.calls)
    assert lines[1] == "== stage lint: ok, no test counts, 1.5 s =="
    assert lines[3] == "== stage unit: ok, 4 passed, 0 failed, 1 skipped, 0 errors, 1.5 s =="
    assert lines[5].startswith("== stage browser: FAILED, 2 passed, 0 failed, 1 skipped, 0 errors, 1.5 s ==")
    assert "browser must run every test, but 1 was skipped" in lines[5]
    assert "tests.t::test_console: why" in lines[5]
    rendered = table(results, STAGES_UNDER_TEST).splitlines()
    assert rendered[0].split() == ["stage", "result", "passed", "failed", "skipped", "errors", "seconds"]
    assert rendered[1].split() == ["lint", "ok", "-", "-", "-", "-", "1.5"]
    assert rendered[2].split() == ["unit", "ok", "4", "0", "1", "0", "1.5"]
    assert rendered[3].split() == ["browser", "FAILED", "2", "0", "1", "0", "1.5"]
    assert rendered[4].split() == ["infra-diff", "not", "run"]
    assert rendered[5].split() == ["total", "FAILED", "4.5"]


def test_an_earlier_runs_report_is_never_read(tmp_path: Path) -> None:
    (tmp_path / "unit.xml").write_text(_xml(7))
    make = FakeMake({"unit": (0, None)})  # this run wrote none
    [result] = run_stages([Stage("unit", pytest=True)], ["make"], tmp_path, make, lambda: 0.0, lambda _: None)
    assert not result.ok
    assert result.counts is None


def test_a_red_make_stops_the_run_with_its_code(tmp_path: Path) -> None:
    make = FakeMake({"lint": (2, None)})
    results = run_stages(STAGES_UNDER_TEST, ["make"], tmp_path, make, lambda: 0.0, lambda _: None)
    assert [r.stage.name for r in results] == ["lint"]
    assert results[0].problem == "`make lint` exited with 2"


def test_main_runs_make_per_stage_and_exits_non_zero_when_one_is_red(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_make = tmp_path / "fake-make"
    # A make that passes `lint` and fails any other stage, after printing pytest-like output.
    # Called as `fake-make --no-print-directory PY=x <stage> JUNIT_DIR=...`.
    fake_make.write_text('#!/bin/sh\n[ "$3" = lint ] && exit 0\necho "1 failed in 0.1s"\nexit 1\n')
    fake_make.chmod(0o755)
    code = main(
        ["--junit-dir", str(tmp_path / "junit"), "--make", str(fake_make), "lint", "unit", "--", "PY=x"]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "== stage lint: ok" in out
    assert "== stage unit: FAILED" in out
    assert "make test: FAILED at stage unit: `make unit` exited with 1" in out
    assert re.search(r"^unit\s+FAILED", out, re.MULTILINE)


def test_an_unknown_stage_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["nope"])
    assert exc.value.code == 2
    assert "unknown stage(s) nope" in capsys.readouterr().err


def test_the_stages_are_the_makefiles_and_every_pytest_stage_writes_its_report() -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipes = dict(re.findall(r"^([a-z-]+):[^\n]*\n((?:\t[^\n]*\n)+)", makefile, re.MULTILINE))
    for stage in STAGES:
        assert stage.name in recipes, stage.name
        assert ("$(JUNIT)" in recipes[stage.name]) == stage.pytest, stage.name
    must_run = {s.name for s in STAGES if s.no_skips}
    assert must_run == {"rules", "observability", "browser", "realvllm", "chaos"}
    assert "tools/test_stages.py" in recipes["test"]


def test_a_result_without_counts_shows_dashes() -> None:
    rendered = table([Result(Stage("lint"), True, True, 2.0, None)], [Stage("lint")])
    assert rendered.splitlines()[1].split() == ["lint", "ok", "-", "-", "-", "-", "2.0"]


def test_results_are_kept_as_each_stage_ends(tmp_path: Path) -> None:
    """`main` prints the stages done so far when interrupted: they are in its list already."""
    kept: list[Result] = []

    def interrupted(argv: Sequence[str]) -> int:
        if argv[-2] == "unit":
            raise KeyboardInterrupt
        return 0

    with pytest.raises(KeyboardInterrupt):
        run_stages(STAGES_UNDER_TEST, ["make"], tmp_path, interrupted, lambda: 0.0, lambda _: None, kept)
    assert [r.stage.name for r in kept] == ["lint"]
    assert table(kept, STAGES_UNDER_TEST).splitlines()[2].split() == ["unit", "not", "run"]


@pytest.mark.parametrize(
    ("makeflags", "dry"),
    [("n -- PY=python3.11", True), ("kn", True), (" -- PY=python3.11", False), ("", False), ("k", False),
     ("--no-print-directory", False)],
)  # fmt: skip
def test_a_dry_run_is_recognised_from_makeflags(makeflags: str, dry: bool) -> None:
    assert dry_run(makeflags) is dry


def test_a_dry_run_needs_no_report() -> None:
    assert judge(Stage("unit", pytest=True), 0, None, dry=True) == (True, "")
