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
            [
                *("admin", "create-key", "--team", "ml", "--model", "llama-3.1-8b-instruct"),
                *("--max-streams", "3", "--max-tokens", "256", "--max-context", "2048"),
            ]
        )
        == 0
    )
    key = json.loads(capsys.readouterr().out)["key"]
    with psycopg.connect(fresh_db_url) as conn:
        row = conn.execute("SELECT hash, max_streams, max_tokens, max_context FROM api_keys").fetchone()
    assert row == (hash_secret(key, b"k"), 3, 256, 2048)
    assert main(["admin", "create-team", "ml"]) == 2  # duplicate: one line, exit 2
    assert "already exists" in capsys.readouterr().err
    assert main(["admin", "mint-admin-token", "--issuer-key", str(tmp_path / "k.pem")]) == 0
    assert looks_like_jwt(capsys.readouterr().out.strip())


def test_register_node_pool_stores_the_hash_idempotently_and_rotates(
    fresh_db_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LLMFLEET_DATABASE_URL", fresh_db_url)
    monkeypatch.setenv("LLMFLEET_REDIS_URL", redis_url)
    monkeypatch.setenv("LLMFLEET_SECRET_KEY", "k")
    monkeypatch.delenv("LLMFLEET_NODE_TOKEN", raising=False)
    assert main(["admin", "migrate"]) == 0
    capsys.readouterr()
    argv = ["admin", "register-node-pool", "--pool", "eks", "--location", "cloud"]
    assert main(argv) == 2  # no token in the environment: one line, exit 2
    assert "LLMFLEET_NODE_TOKEN" in capsys.readouterr().err
    token = "a" * 48
    monkeypatch.setenv("LLMFLEET_NODE_TOKEN", token)
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert json.loads(out) == {"pool": "eks", "location": "cloud", "status": "created"}
    assert token not in out
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "unchanged"

    def row() -> tuple[object, ...] | None:
        with psycopg.connect(fresh_db_url) as conn:
            return conn.execute(
                "SELECT token_hash, kind, revoked_at IS NOT NULL FROM node_tokens WHERE node_id = 'eks'"
            ).fetchone()

    assert row() == (hash_secret(token, b"k"), "pool", False)
    with psycopg.connect(fresh_db_url) as conn:
        conn.execute("UPDATE node_tokens SET revoked_at = now() WHERE node_id = 'eks'")
    assert main(argv) == 0  # the deploy Job re-running must not fail, nor undo the revoke
    captured = capsys.readouterr()
    assert json.loads(captured.out)["status"] == "revoked"
    assert "stays revoked" in captured.err
    assert row() == (hash_secret(token, b"k"), "pool", True)
    monkeypatch.setenv("LLMFLEET_NODE_TOKEN", "b" * 48)
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "rotated"
    assert row() == (hash_secret("b" * 48, b"k"), "pool", False)
    assert main(["admin", "register-node-pool", "--pool", "eks/x", "--location", "cloud"]) == 2
    assert "must not contain '/'" in capsys.readouterr().err
