"""moto's in-process S3 for the model-sync tests (fake credentials, one bucket), and a local
model-signing key pair as `llmfleet model publish --signing-key` creates it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from apps.modelsync.signing import LocalSigner, LocalVerifier, public_key_path


@contextlib.contextmanager
def mock_bucket(monkeypatch: pytest.MonkeyPatch, bucket: str) -> Iterator[Any]:
    """A boto3 S3 client on moto with `bucket` created (and test credentials in the environment; no
    registry settings from the environment: the commands take what the test gives them)."""
    for name in ("LLMFLEET_MODEL_BUCKET", "LLMFLEET_S3_ENDPOINT_URL", "LLMFLEET_MODEL_SIGNING_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=bucket)
        yield client


@dataclass(frozen=True)
class KeyPair:
    private: Path  # what `model publish --signing-key` takes
    public: Path  # what model-sync's LLMFLEET_MODEL_VERIFY_KEY names
    signer: LocalSigner
    verifier: LocalVerifier


def key_pair(directory: Path) -> KeyPair:
    """A new local signing key in `directory` (created as `model publish` creates one)."""
    private = directory / "model-signing.pem"
    signer = LocalSigner.load_or_create(private)
    public = public_key_path(private)
    return KeyPair(private, public, signer, LocalVerifier.load(public))
