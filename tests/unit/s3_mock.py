"""moto's in-process S3 for the model-sync tests: fake credentials, one bucket."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws


@contextlib.contextmanager
def mock_bucket(monkeypatch: pytest.MonkeyPatch, bucket: str) -> Iterator[Any]:
    """A boto3 S3 client on moto with `bucket` created (and test credentials in the environment)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=bucket)
        yield client
