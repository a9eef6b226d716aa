"""Publish a model revision: its files under `s3://<bucket>/<model>/<revision>/`, then its signed
manifest (`apps/modelsync/manifest.py`).

The upload itself is `upload.py`'s (resumable: files already there with the same checksum are
skipped). A revision with a manifest is published and never written again: publishing it a
second time is refused before anything is uploaded, and the manifest (with its signature, one
object) is put with S3's conditional write (`If-None-Match: *`), so of two publishers racing on
one revision one wins and the other is told, and nothing of the winner's is replaced.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from apps.modelsync.manifest import MANIFEST_NAME, OURS, Manifest, build_manifest
from apps.modelsync.signing import ALGORITHM, Signer, seal
from apps.modelsync.sync import ModelSyncError, safe_component
from apps.modelsync.upload import UploadResult, UploadStore, local_files, upload_files


class PublishStore(UploadStore, Protocol):
    def put_bytes(self, bucket: str, key: str, data: bytes, *, if_absent: bool = False) -> bool: ...


@dataclass(frozen=True)
class PublishResult:
    upload: UploadResult
    manifest: Manifest


class AlreadyPublished(ModelSyncError):
    code = "revision_already_published"


def publish_model(
    store: PublishStore,
    signer: Signer,
    bucket: str,
    name: str,
    revision: str,
    root: Path,
    serving: dict[str, Any],
) -> PublishResult:
    prefix = f"{safe_component(name, 'model')}/{safe_component(revision, 'revision')}/"
    where = f"s3://{bucket}/{prefix}"
    files = local_files(root)
    clashing = sorted(str(f.relative) for f in files if str(f.relative) in OURS)
    if clashing:
        raise ModelSyncError(
            f"{root}: {clashing[0]} is a name of the platform's own; rename it", param="from"
        )
    store.check_bucket(bucket)
    remote = {obj.key: obj for obj in store.remote_files(bucket, prefix)}
    if prefix + MANIFEST_NAME in remote:
        raise AlreadyPublished(
            f"{where}: already published (it has {MANIFEST_NAME}); a revision is never overwritten: "
            "publish under a new revision",
            param="revision",
        )
    ours = {prefix + str(f.relative) for f in files} | {prefix + name for name in OURS}
    extra = sorted(key for key in remote if key not in ours and not key.endswith("/"))
    if extra:
        raise ModelSyncError(
            f"{where}: {extra[0]} is not in {root} ({len(extra)} such object(s)); a revision holds exactly "
            "its files: delete them (the revision is not published yet) or publish under a new revision",
            param="revision",
        )
    result = upload_files(store, bucket, prefix, files, remote)
    manifest = build_manifest(
        name,
        revision,
        [(f.relative, f.size, f.sha256) for f in files],
        serving,
        {"key_id": signer.key_id, "algorithm": ALGORITHM},
    )
    if not store.put_bytes(bucket, prefix + MANIFEST_NAME, seal(manifest, signer), if_absent=True):
        raise AlreadyPublished(
            f"{where}: published meanwhile by someone else; nothing of theirs was replaced"
        )
    return PublishResult(result, manifest)
