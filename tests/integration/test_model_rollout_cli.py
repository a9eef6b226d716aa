"""`llmfleet model canary|promote|rollback|status` against PostgreSQL (apps/modelsync/rollout_cli.py):
what a platform engineer types, and one clear line with exit 2 for what is refused."""

from __future__ import annotations

import json

import pytest

from apps.cli.main import main

pytestmark = pytest.mark.timeout(60)
MODEL = "llama-3.1-8b-instruct"


def _run(db: str, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["model", *args, "--model", MODEL, "--database-url", db, "--actor", "alice"])
    out, err = capsys.readouterr()
    return code, out, err


def test_canary_weight_promote_rollback_and_status(
    migrated_db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db = migrated_db_url
    code, _, err = _run(db, capsys, "canary", "--revision", "r2", "--weight", "5")
    assert (code, err.strip()) == (
        2,
        "llmfleet model: error: model 'llama-3.1-8b-instruct' has no rollout yet: "
        "say which revision is stable (--stable or --stack)",
    )
    code, out, _ = _run(db, capsys, "canary", "--revision", "r2", "--weight", "5", "--stack", "dev")
    assert code == 0
    state = json.loads(out)
    assert (state["canary"], state["weight_percent"]) == ("r2", 5.0)
    assert state["stable"]  # the dev stack's revision of the model
    code, out, _ = _run(db, capsys, "canary", "--revision", "r2", "--weight", "10")
    assert json.loads(out)["weight_percent"] == 10.0
    code, _, err = _run(db, capsys, "canary", "--revision", "r3", "--weight", "10")
    assert code == 2
    assert "canary 'r2' of 'llama-3.1-8b-instruct' is live: promote or roll it back first" in err
    code, out, _ = _run(db, capsys, "rollback", "--reason", "p95 too high")
    assert (code, json.loads(out)["canary"]) == (0, None)
    code, _, err = _run(db, capsys, "rollback")
    assert (code, "has no live canary" in err) == (2, True)
    assert _run(db, capsys, "canary", "--revision", "r3", "--weight", "50")[0] == 0
    code, out, _ = _run(db, capsys, "promote")
    assert (code, json.loads(out)["stable"], json.loads(out)["canary"]) == (0, "r3", None)
    code, out, _ = _run(db, capsys, "status")
    lines = out.splitlines()
    assert lines[0] == f"{MODEL}: stable r3"
    assert [line.split()[1:3] for line in lines[1:]] == [
        ["promote", "r3"], ["canary", "r3"], ["rollback", "r2"], ["canary", "r2"], ["canary", "r2"],
    ]  # fmt: skip
    assert "by alice (p95 too high)" in lines[3]
    code, out, _ = _run(db, capsys, "status", "--json")
    assert len(json.loads(out)["history"]) == 5


def test_bad_input_is_one_line_and_exit_2(migrated_db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    for args, message in (
        (
            ["canary", "--revision", "r2", "--weight", "120", "--stable", "r1"],
            "weight: a percentage from 0 to 100",
        ),
        (["canary", "--revision", "r1", "--weight", "5", "--stable", "r1"], "is the stable revision"),
        (["promote"], "has no canary to promote"),
    ):
        code, out, err = _run(migrated_db_url, capsys, *args)
        assert code == 2
        assert out == ""
        assert len(err.strip().splitlines()) == 1
        assert message in err
    code = main(["model", "status", "--model", MODEL, "--database-url", ""])
    assert code == 2
    assert "no database" in capsys.readouterr().err
