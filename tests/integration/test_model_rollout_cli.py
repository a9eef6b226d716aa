"""`llmfleet model canary|promote|rollback|status` against PostgreSQL (apps/modelsync/rollout_cli.py)
and the registry on moto's S3 (the evaluation gate, apps/modelsync/evalgate.py): what a platform
engineer types, and one clear line with exit 2 for what is refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apps.cli.main import main
from apps.modelsync.evalgate import manifest_sha256, write_result
from apps.modelsync.publish import publish_model
from apps.modelsync.s3 import Boto3ObjectStore
from tests.unit.s3_mock import KeyPair, key_pair, mock_bucket

pytestmark = pytest.mark.timeout(60)
MODEL = "llama-3.1-8b-instruct"
BUCKET = "llmfleet-models"
GATE: list[str] = []  # the registry options of `canary` and `promote` (`registry` fixture)


@pytest.fixture(autouse=True)
def registry(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[KeyPair]:
    """r2 and r3 published with passing evaluations; r4 published, never evaluated."""
    with mock_bucket(monkeypatch, BUCKET) as client:
        keys = key_pair(tmp_path)
        store = Boto3ObjectStore(client)
        for revision in ("r2", "r3", "r4"):
            (tmp_path / revision).mkdir()
            (tmp_path / revision / "model.safetensors").write_bytes(revision.encode())
            publish_model(store, keys.signer, BUCKET, MODEL, revision, tmp_path / revision, {})
            if revision != "r4":
                manifest = manifest_sha256(store, keys.verifier, BUCKET, MODEL, revision)
                write_result(store, keys.signer, BUCKET, MODEL, revision, _passed(manifest))
        GATE[:] = ["--bucket", BUCKET, "--verify-key", str(keys.public)]
        yield keys


def _passed(manifest: str) -> dict[str, Any]:
    return {
        "manifest_sha256": manifest,
        "cases": [],
        "pass_ratio": 1.0,
        "min_pass_ratio": 1.0,
        "passed": True,
    }


def _run(db: str, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    gate = GATE if args[0] in ("canary", "promote") else []
    code = main(["model", *args, *gate, "--model", MODEL, "--database-url", db, "--actor", "alice"])
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


def test_the_gate_lets_only_an_evaluated_revision_take_traffic(
    migrated_db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db = migrated_db_url
    code, out, err = _run(db, capsys, "canary", "--revision", "r4", "--weight", "5", "--stable", "r1")
    assert (code, out) == (2, "")
    assert err.strip() == (
        f"llmfleet model: error: {MODEL} revision r4 has no evaluation: run `llmfleet model eval` on it first"
    )
    # Weight 0 stages the candidate without traffic (where `llmfleet model eval` runs its golden set).
    code, out, _ = _run(db, capsys, "canary", "--revision", "r4", "--weight", "0", "--stable", "r1")
    assert (code, json.loads(out)["canary"], json.loads(out)["weight_percent"]) == (0, "r4", 0.0)
    code, _, err = _run(db, capsys, "canary", "--revision", "r4", "--weight", "5")
    assert (code, "has no evaluation" in err) == (2, True)
    code, _, err = _run(db, capsys, "promote")
    assert (code, "has no evaluation" in err) == (2, True)
    code, out, _ = _run(db, capsys, "status", "--json")
    assert (json.loads(out)["stable"], json.loads(out)["weight_percent"]) == ("r1", 0.0)  # nothing moved
    # Without the registry the gate cannot be checked: refused, not skipped.
    code = main(["model", "promote", "--model", MODEL, "--database-url", db, "--verify-key", GATE[3]])
    assert code == 2
    assert "no bucket" in capsys.readouterr().err


def test_bad_input_is_one_line_and_exit_2(migrated_db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    for args, message in (
        (
            ["canary", "--revision", "r2", "--weight", "120", "--stable", "r1"],
            "weight: a percentage from 0 to 100",
        ),
        (["canary", "--revision", "r2", "--weight", "5", "--stable", "r2"], "is the stable revision"),
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
