"""`llmfleet infra diff` (issue 13): + / ~ with paths / - per resource, exit 0/1/2."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from apps.cli.main import main
from infra.diff import changed_paths, diff_lines
from tests.infra.conftest import rendered


def test_changed_paths_name_the_leaves() -> None:
    old = {"spec": {"replicas": 1, "ports": [{"port": 80}]}, "x": 1}
    new = {"spec": {"replicas": 2, "ports": [{"port": 81}]}, "y": 1}
    assert changed_paths(old, new) == ["spec.ports[0].port", "spec.replicas", "x", "y"]
    assert changed_paths(old, copy.deepcopy(old)) == []


def test_diff_lines_add_change_remove() -> None:
    a = [{"type": "t", "name": "keep", "inputs": {"v": 1}}, {"type": "t", "name": "gone", "inputs": {}}]
    b = [{"type": "t", "name": "keep", "inputs": {"v": 2}}, {"type": "t", "name": "new", "inputs": {}}]
    assert diff_lines(a, b) == ["- t gone", "~ t keep: inputs.v", "+ t new"]


def test_no_change_against_the_golden_file_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["infra", "diff", "--stack", "dev"]) == 0
    assert "0 to add, 0 to change, 0 to remove" in capsys.readouterr().out


def test_changes_against_an_edited_snapshot_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = copy.deepcopy(rendered("dev"))
    job = next(r for r in rows if r["type"] == "kubernetes:batch/v1:Job")
    job["inputs"]["spec"]["backoffLimit"] = 9
    gone = rows.pop(next(i for i, r in enumerate(rows) if r["type"] == "aws:ec2/tag:Tag"))
    rows.append({"type": "aws:s3/bucket:Bucket", "name": "old-bucket", "inputs": {}, "dependsOn": []})
    golden = tmp_path / "dev.golden.json"
    golden.write_text(json.dumps(rows), encoding="utf-8")
    assert main(["infra", "diff", "--stack", "dev", "--golden", str(golden)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert f"~ kubernetes:batch/v1:Job {job['name']}: inputs.spec.backoffLimit" in out
    assert f"+ aws:ec2/tag:Tag {gone['name']}" in out
    assert "- aws:s3/bucket:Bucket old-bucket" in out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--stack", "nope"], "nope"),
        (["--stack", "dev", "--base", "no-such-revision-xyz"], "no-such-revision-xyz"),
        (["--stack", "dev", "--golden", "/nonexistent/dev.golden.json"], "cannot read golden file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["infra", "diff", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err
    assert "\n" not in err


def test_a_snapshot_that_is_not_json_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{not json", encoding="utf-8")
    assert main(["infra", "diff", "--stack", "dev", "--golden", str(bad)]) == 2
    assert "not a rendered snapshot" in capsys.readouterr().err
