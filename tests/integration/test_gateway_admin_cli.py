"""`llmfleet admin` bootstrap commands against real PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from apps.cli.main import main
from apps.core.identity.jwt_verify import looks_like_jwt
from apps.core.secrets import hash_secret


def test_bootstrap_team_key_credits(
    fresh_db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("LLMFLEET_DATABASE_URL", fresh_db_url)
    monkeypatch.setenv("LLMFLEET_SECRET_KEY", "k")
    assert main(["admin", "migrate"]) == 0
    assert "0001_ledger.sql" in json.loads(capsys.readouterr().out)["applied"]
    assert main(["admin", "migrate"]) == 0
    assert json.loads(capsys.readouterr().out)["applied"] == []
    assert main(["admin", "create-team", "ml", "--credits", "2.5"]) == 0
    assert json.loads(capsys.readouterr().out)["balance_microcredits"] == 2_500_000
    assert main(["admin", "add-credits", "--team", "ml", "--amount", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["balance_microcredits"] == 3_500_000
    assert (
        main(
            ["admin", "create-key", "--team", "ml", "--model", "llama-3.1-8b-instruct", "--max-streams", "3"]
        )
        == 0
    )
    key = json.loads(capsys.readouterr().out)["key"]
    with psycopg.connect(fresh_db_url) as conn:
        row = conn.execute("SELECT hash, max_streams FROM api_keys").fetchone()
    assert row == (hash_secret(key, b"k"), 3)
    assert main(["admin", "create-team", "ml"]) == 2  # duplicate: one line, exit 2
    assert "already exists" in capsys.readouterr().err
    assert main(["admin", "mint-admin-token", "--issuer-key", str(tmp_path / "k.pem")]) == 0
    assert looks_like_jwt(capsys.readouterr().out.strip())
