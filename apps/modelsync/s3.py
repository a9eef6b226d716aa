"""The boto3-backed `ObjectStore` / `UploadStore` used in production (and against moto in tests)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from apps.modelsync.sync import ModelSyncError, RemoteObject
from apps.modelsync.upload import SHA256_METADATA, RemoteFile

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

    def check_bucket(self, bucket: str) -> None:
        try:
            self._client.head_bucket(Bucket=bucket)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "?")
            raise ModelSyncError(f"s3://{bucket}: bucket not reachable ({code})", param="bucket") from None
        except BotoCoreError as exc:
            raise ModelSyncError(f"s3://{bucket}: bucket not reachable ({exc})", param="bucket") from None

    def remote_files(self, bucket: str, prefix: str) -> Iterator[RemoteFile]:
        for obj in self.list_objects(bucket, prefix):
            head = self._client.head_object(Bucket=bucket, Key=obj.key)
            yield RemoteFile(
                key=obj.key,
                size=head["ContentLength"],
                etag=head["ETag"].strip('"'),
                sha256=head.get("Metadata", {}).get(SHA256_METADATA),
            )

    def upload(self, bucket: str, key: str, source: Path, metadata: dict[str, str]) -> None:
        self._client.upload_file(str(source), bucket, key, ExtraArgs={"Metadata": metadata})

    def get_bytes(self, bucket: str, key: str) -> bytes | None:
        """A small object's content (our manifest and signature); None when there is none."""
        try:
            answer = self._client.get_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise
        return bytes(answer["Body"].read())

    def put_bytes(self, bucket: str, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        """Write a small object; with `if_absent`, only where none is (S3's conditional write):
        False when one already was."""
        try:
            if if_absent:
                self._client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
            else:
                self._client.put_object(Bucket=bucket, Key=key, Body=data)
        except ClientError as exc:
            if if_absent and exc.response.get("Error", {}).get("Code") in ("PreconditionFailed", "412"):
                return False
            raise
        return True
