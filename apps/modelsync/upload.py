"""Upload a local weights directory to the model bucket, in the layout `sync_model` reads (the
files half of `llmfleet model publish`, `apps/modelsync/publish.py`).

`<dir>/<relative path>` becomes `s3://<bucket>/<model>/<revision>/<relative path>` (POSIX
separators). Every object carries the SHA-256 of its content in its metadata; a file whose
remote copy has the same size and the same checksum (that metadata, or a single-part ETag
equal to the file's MD5) is skipped, so a second run uploads nothing and an interrupted run
resumes where it stopped. Nothing is ever deleted from the bucket.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Protocol

from apps.modelsync.sync import MARKER, ModelSyncError

SHA256_METADATA = "sha256"  # stored as `x-amz-meta-sha256`
_CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True)
class RemoteFile:
    key: str
    size: int
    etag: str  # without quotes
    sha256: str | None  # our metadata; None for objects uploaded by other tools


@dataclass(frozen=True)
class LocalFile:
    path: Path
    relative: PurePosixPath
    size: int
    sha256: str
    md5: str


@dataclass(frozen=True)
class UploadResult:
    prefix: str
    files: int
    uploaded: int
    skipped: int
    bytes_uploaded: int


class UploadStore(Protocol):
    """The S3 operations the upload needs; `Boto3ObjectStore` is the production one."""

    def check_bucket(self, bucket: str) -> None: ...

    def remote_files(self, bucket: str, prefix: str) -> Iterator[RemoteFile]: ...

    def upload(self, bucket: str, key: str, source: Path, metadata: dict[str, str]) -> None: ...


def local_files(root: Path) -> list[LocalFile]:
    """Every regular file below `root` (symlinked files are read through), sorted by path.

    The completion marker of a node's cache is left out: uploading from a synced copy
    (`/models/<model>/<revision>`) gives the same objects as the original directory.
    """
    if not root.is_dir():
        raise ModelSyncError(f"{root}: not a directory", param="from")
    out: list[LocalFile] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in dirnames:
            if (Path(dirpath) / name).is_symlink():  # os.walk does not descend: never skip silently
                raise ModelSyncError(
                    f"{Path(dirpath) / name}: symlinked directory, not followed", param="from"
                )
        for name in sorted(filenames):
            path = Path(dirpath) / name
            relative = PurePosixPath(path.relative_to(root).as_posix())
            if relative == PurePosixPath(MARKER):
                continue
            if not path.is_file():  # a dangling link (an unfinished download) or a socket/fifo
                raise ModelSyncError(f"{path}: not a readable regular file", param="from")
            out.append(_hashed(path, relative))
    if not out:
        raise ModelSyncError(f"{root}: no files to upload", param="from")
    return out


def _hashed(path: Path, relative: PurePosixPath) -> LocalFile:
    sha256, md5, size = hashlib.sha256(), hashlib.md5(usedforsecurity=False), 0
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            sha256.update(chunk)
            md5.update(chunk)
            size += len(chunk)
    return LocalFile(path, relative, size, sha256.hexdigest(), md5.hexdigest())


def _same(local: LocalFile, remote: RemoteFile | None) -> bool:
    if remote is None or remote.size != local.size:
        return False
    if remote.sha256 is not None:
        return remote.sha256 == local.sha256
    return "-" not in remote.etag and remote.etag == local.md5  # single-part: the ETag is the MD5


def upload_files(
    store: UploadStore, bucket: str, prefix: str, files: list[LocalFile], remote: dict[str, RemoteFile]
) -> UploadResult:
    """Make `s3://bucket/<prefix>` hold every one of `files` (skipping those `remote` has the same)."""
    uploaded = skipped = sent = 0
    for local in files:
        key = prefix + str(local.relative)
        if _same(local, remote.get(key)):
            skipped += 1
            continue
        store.upload(bucket, key, local.path, {SHA256_METADATA: local.sha256})
        uploaded += 1
        sent += local.size
    return UploadResult(prefix, len(files), uploaded, skipped, sent)
