"""The boto3-backed `ObjectStore` used in production (and against moto in tests)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from apps.modelsync.sync import RemoteObject

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


class Boto3ObjectStore:
    def __init__(self, client: S3Client) -> None:
        self._client = client

    def list_objects(self, bucket: str, prefix: str) -> Iterator[RemoteObject]:
        paginator = self._client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                yield RemoteObject(key=item["Key"], size=item["Size"])

    def download(self, bucket: str, key: str, dest: Path) -> None:
        self._client.download_file(bucket, key, str(dest))
