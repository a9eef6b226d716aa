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
