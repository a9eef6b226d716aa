"""The evaluation gate (apps/modelsync/evalgate.py) against moto's S3 and real signatures: a passing,
signed result bound to the revision's manifest lets it through; no result, a failed one, one signed
by another key, edited, or copied from another revision does not; model-sync ignores the result."""

from __future__ import annotations

import json
from argparse import Namespace
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apps.modelsync.eval_cli import verifier_for
from apps.modelsync.evalgate import (
    EvaluationFailed,
    NotEvaluated,
    manifest_sha256,
    require_passing,
    write_result,
)
from apps.modelsync.manifest import EVAL_NAME, ManifestError
from apps.modelsync.publish import publish_model
from apps.modelsync.s3 import Boto3ObjectStore
from apps.modelsync.settings import ModelSyncSettings
from apps.modelsync.signing import KmsVerifier, LocalVerifier
from apps.modelsync.sync import SyncOutcome, sync_model
from tests.unit.s3_mock import KeyPair, key_pair, mock_bucket

pytestmark = pytest.mark.timeout(60)
BUCKET = "llmfleet-models"
MODEL = "llama-3.1-8b-instruct"


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with mock_bucket(monkeypatch, BUCKET) as client:
        yield client


@pytest.fixture
def keys(tmp_path: Path) -> KeyPair:
    (tmp_path / "k").mkdir()
    return key_pair(tmp_path / "k")


def _publish(store: Boto3ObjectStore, keys: KeyPair, tmp_path: Path, revision: str) -> str:
    root = tmp_path / f"w-{revision}"
    root.mkdir()
    (root / "config.json").write_bytes(b'{"layers": 2}')
    (root / "model.safetensors").write_bytes(revision.encode() * 100)
    publish_model(store, keys.signer, BUCKET, MODEL, revision, root, {})
    return manifest_sha256(store, keys.verifier, BUCKET, MODEL, revision)


def _result(manifest: str, passed: bool = True) -> dict[str, Any]:
    return {
        "manifest_sha256": manifest,
        "cases": [{"name": "capital", "passed": passed, "reason": None if passed else "x", "ttft_s": 0.1}],
        "pass_ratio": 1.0 if passed else 0.0,
        "min_pass_ratio": 1.0,
        "ttft_p95_s": 0.1,
        "slo_ttft_p95_s": 3.0,
        "latency_ok": True,
        "passed": passed,
    }


def test_only_a_signed_passing_result_of_this_revision_passes_the_gate(
    s3: Any, keys: KeyPair, tmp_path: Path
) -> None:
    store = Boto3ObjectStore(s3)
    r2 = _publish(store, keys, tmp_path, "r2")
    r3 = _publish(store, keys, tmp_path, "r3")

    with pytest.raises(NotEvaluated, match="has no evaluation: run `llmfleet model eval` on it first"):
        require_passing(store, keys.verifier, BUCKET, MODEL, "r2")

    write_result(store, keys.signer, BUCKET, MODEL, "r2", _result(r2, passed=False))
    with pytest.raises(EvaluationFailed) as failed:
        require_passing(store, keys.verifier, BUCKET, MODEL, "r2")
    assert str(failed.value) == (
        f"{MODEL} revision r2 failed its evaluation: 0.0 of cases passed (needs 1.0), failed: capital;"
        " TTFT p95 0.1 s (SLO 3.0 s)"
    )
    assert failed.value.code == "revision_failed_evaluation"

    write_result(store, keys.signer, BUCKET, MODEL, "r2", _result(r2))  # a later evaluation replaces it
    body = require_passing(store, keys.verifier, BUCKET, MODEL, "r2")
    assert (body["model"], body["revision"], body["passed"]) == (MODEL, "r2", True)

    key = f"{MODEL}/r2/{EVAL_NAME}"
    signed = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()

    # Edited after signing (a failed result turned into a pass): the signature no longer verifies.
    write_result(store, keys.signer, BUCKET, MODEL, "r3", _result(r3, passed=False))
    edited = json.loads(s3.get_object(Bucket=BUCKET, Key=f"{MODEL}/r3/{EVAL_NAME}")["Body"].read())
    edited["evaluation"]["passed"] = True
    s3.put_object(Bucket=BUCKET, Key=f"{MODEL}/r3/{EVAL_NAME}", Body=json.dumps(edited).encode())
    with pytest.raises(ManifestError, match="evaluation's signature does not verify"):
        require_passing(store, keys.verifier, BUCKET, MODEL, "r3")

    # r2's passing result copied onto r3: signed, but not of r3's manifest.
    s3.put_object(Bucket=BUCKET, Key=f"{MODEL}/r3/{EVAL_NAME}", Body=signed)
    with pytest.raises(ManifestError, match="the evaluation is not of this revision's manifest"):
        require_passing(store, keys.verifier, BUCKET, MODEL, "r3")

    # Signed by another key (someone with write access to the bucket, not the signing key).
    other = key_pair(tmp_path)
    write_result(store, other.signer, BUCKET, MODEL, "r3", _result(r3))
    with pytest.raises(ManifestError, match="evaluation's signature does not verify"):
        require_passing(store, keys.verifier, BUCKET, MODEL, "r3")


def test_an_unpublished_revision_is_refused_before_any_result_is_read(s3: Any, keys: KeyPair) -> None:
    store = Boto3ObjectStore(s3)
    with pytest.raises(ManifestError, match="unsigned revision"):
        require_passing(store, keys.verifier, BUCKET, MODEL, "never-published")


def test_model_sync_copies_a_revision_with_a_result_and_leaves_the_result_out(
    s3: Any, keys: KeyPair, tmp_path: Path
) -> None:
    store = Boto3ObjectStore(s3)
    r2 = _publish(store, keys, tmp_path, "r2")
    write_result(store, keys.signer, BUCKET, MODEL, "r2", _result(r2))
    result = sync_model(store, keys.verifier, BUCKET, MODEL, "r2", tmp_path / "cache")
    assert result.outcome is SyncOutcome.COPIED
    copied = tmp_path / "cache" / MODEL / "r2"
    assert sorted(p.name for p in copied.iterdir() if not p.name.startswith(".")) == [
        "config.json",
        "model.safetensors",
    ]


def test_the_eval_command_checks_the_manifest_with_the_key_it_signs_with(
    monkeypatch: pytest.MonkeyPatch, keys: KeyPair
) -> None:
    """`--signing-key` (dev): its public half; `--kms-key-id`: that KMS key; `--verify-key` wins."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    settings = ModelSyncSettings(model_verify_key=None, model_signing_key=None)
    kms = verifier_for(Namespace(verify_key=None, signing_key=None, kms_key_id="alias/models"), settings)
    assert isinstance(kms, KmsVerifier)
    assert kms.key_id == "alias/models"
    local = verifier_for(Namespace(verify_key=None, signing_key=keys.private, kms_key_id=None), settings)
    digest = b"\x01" * 32
    assert isinstance(local, LocalVerifier)
    assert local.verify(digest, keys.signer.sign(digest))
    chosen = verifier_for(Namespace(verify_key=keys.public, signing_key=None, kms_key_id="alias/x"), settings)
    assert isinstance(chosen, LocalVerifier)
