"""Copy one model revision from S3 into the node's local model cache, at most once, verified.

Owns the on-disk contract of the cache: `<root>/<name>/<revision>/` is complete if and only
if it holds the marker file `MARKER`. A copy is downloaded into a hidden temporary
directory next to it, the marker is written last, and the directory is renamed into place
in one `rename(2)`, so a pod killed mid-copy (or two pods racing on one node) never leaves
a directory that looks complete.

Nothing is marked complete unless the revision is the one its publisher signed
(`apps/modelsync/manifest.py`): its manifest's signature verifies with the configured key, it
names this model and revision, the bucket holds exactly the files it lists, and every file
copied has the listed size and SHA-256. Anything else is one `ManifestError` line and no copy.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Protocol

from apps.core.errors import LlmfleetError
from apps.modelsync.manifest import MANIFEST_NAME, OURS, Manifest, ManifestError
from apps.modelsync.signing import Verifier, unseal

MARKER = ".llmfleet-complete"
# A partial directory this old belongs to a pod that was killed mid-copy (SIGKILL skips our
# cleanup); a live copy of even the largest model finishes well within it.
STALE_PARTIAL_S = 6 * 3600


class ModelSyncError(LlmfleetError):
    """The revision cannot be copied (missing in S3, unsafe key, size mismatch)."""

    code = "model_sync_failed"


class SyncOutcome(enum.Enum):
    COPIED = "copied"
    SKIPPED = "skipped"  # the marker was already there (or a racing pod finished first)


@dataclass(frozen=True)
class SyncResult:
    outcome: SyncOutcome
    path: Path
    files: int
    bytes: int


@dataclass(frozen=True)
class RemoteObject:
    key: str
    size: int


class ObjectStore(Protocol):
    """The S3 operations the copy needs; `Boto3ObjectStore` is the production one."""

    def list_objects(self, bucket: str, prefix: str) -> Iterator[RemoteObject]: ...

    def download(self, bucket: str, key: str, dest: Path) -> None: ...

    def get_bytes(self, bucket: str, key: str) -> bytes | None: ...


def safe_component(value: str, field: str) -> str:
    if not value or value in (".", "..") or "/" in value or value.startswith("."):
        raise ModelSyncError(f"{field}: {value!r} is not a valid path component", param=field)
    return value


def _relative_path(key: str, prefix: str) -> PurePosixPath:
    rel = PurePosixPath(key[len(prefix) :])
    if rel.is_absolute() or ".." in rel.parts or not rel.parts or rel.name == MARKER:
        raise ModelSyncError(f"refusing unsafe object key {key!r}", param="key")
    return rel


def remove_stale_partials(parent: Path, revision: str, now: float, max_age_s: float = STALE_PARTIAL_S) -> int:
    """Delete temporary directories of `revision` left by killed copies; returns how many."""
    removed = 0
    for candidate in parent.glob(f".{revision}.partial-*"):
        try:
            age = now - candidate.stat().st_mtime
        except FileNotFoundError:  # its owner just published or removed it
            continue
        if age > max_age_s:
            shutil.rmtree(candidate, ignore_errors=True)
            removed += 1
    return removed


def sync_model(
    store: ObjectStore,
    verifier: Verifier,
    bucket: str,
    name: str,
    revision: str,
    root: Path,
    now: float | None = None,
) -> SyncResult:
    """Make `root/name/revision` a complete, verified copy of `s3://bucket/name/revision/`.

    `now` (wall-clock seconds, injectable for tests) ages leftovers of killed copies.
    """
    final = root / safe_component(name, "model") / safe_component(revision, "revision")
    marker = final / MARKER
    if marker.is_file():
        return _result_from_marker(SyncOutcome.SKIPPED, final)
    prefix = f"{name}/{revision}/"
    objects = [obj for obj in store.list_objects(bucket, prefix) if not obj.key.endswith("/")]
    if not objects:
        raise ModelSyncError(f"no objects under s3://{bucket}/{prefix}", param="revision")
    manifest, manifest_sha = verified_manifest(store, verifier, bucket, prefix, name, revision)
    listed = manifest.by_path()
    payload = [obj for obj in objects if str(_relative_path(obj.key, prefix)) not in OURS]
    _check_listing(f"s3://{bucket}/{prefix}", listed, {str(_relative_path(o.key, prefix)) for o in payload})
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(final.parent, revision, time.time() if now is None else now)
    tmp = final.parent / f".{revision}.partial-{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        total = 0
        for obj in payload:
            rel = _relative_path(obj.key, prefix)
            dest = tmp.joinpath(*rel.parts)
            dest.parent.mkdir(parents=True, exist_ok=True)
            store.download(bucket, obj.key, dest)
            _check_file(f"s3://{bucket}/{obj.key}", dest, listed[str(rel)].size, listed[str(rel)].sha256)
            total += listed[str(rel)].size
        _write_marker(
            tmp,
            {
                "bucket": bucket,
                "prefix": prefix,
                "files": len(payload),
                "bytes": total,
                "manifest": manifest_sha,
            },
        )
        return _publish(tmp, final, len(payload), total)
    finally:
        # Whatever happened, a temporary directory never outlives this call.
        shutil.rmtree(tmp, ignore_errors=True)


def verified_manifest(
    store: ObjectStore, verifier: Verifier, bucket: str, prefix: str, name: str, revision: str
) -> tuple[Manifest, str]:
    where = f"s3://{bucket}/{prefix}"
    raw = store.get_bytes(bucket, prefix + MANIFEST_NAME)
    if raw is None:
        raise ManifestError(
            f"{where}: unsigned revision (no {MANIFEST_NAME}); publish it with `llmfleet model publish`",
            param="revision",
        )
    manifest = unseal(raw, verifier, where)
    if (manifest.model, manifest.revision) != (name, revision):
        raise ManifestError(
            f"{where}: the manifest is signed for {manifest.model} {manifest.revision}, not {name} {revision}"
        )
    return manifest, hashlib.sha256(raw).hexdigest()


def _check_listing(where: str, listed: Mapping[str, object], present: set[str]) -> None:
    unlisted = sorted(present - set(listed))
    if unlisted:
        raise ManifestError(
            f"{where}: {unlisted[0]} is not in the signed manifest ({len(unlisted)} such file(s))"
        )
    missing = sorted(set(listed) - present)
    if missing:
        raise ManifestError(f"{where}: {missing[0]} is in the signed manifest but not in the bucket")


def _check_file(where: str, path: Path, size: int, sha256: str) -> None:
    got_size = path.stat().st_size
    if got_size != size:
        raise ManifestError(f"{where}: got {got_size} bytes, the signed manifest says {size}")
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(8 * 1024 * 1024):
            digest.update(chunk)
    if digest.hexdigest() != sha256:
        raise ManifestError(f"{where}: its SHA-256 differs from the signed manifest's (tampered or corrupt)")


def _write_marker(directory: Path, content: dict[str, object]) -> None:
    path = directory / MARKER
    with path.open("w", encoding="utf-8") as fh:
        json.dump(content, fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())


def _publish(tmp: Path, final: Path, files: int, size: int) -> SyncResult:
    if final.exists() and not (final / MARKER).is_file():
        # A directory without a marker is never trusted (left by something other than us).
        shutil.rmtree(final)
    try:
        tmp.rename(final)
    except OSError:
        if (final / MARKER).is_file():  # a pod on the same node won the race
            return _result_from_marker(SyncOutcome.SKIPPED, final)
        raise
    return SyncResult(SyncOutcome.COPIED, final, files, size)


def _result_from_marker(outcome: SyncOutcome, final: Path) -> SyncResult:
    try:
        data = json.loads((final / MARKER).read_text(encoding="utf-8"))
        return SyncResult(outcome, final, int(data.get("files", 0)), int(data.get("bytes", 0)))
    except (OSError, ValueError):
        return SyncResult(outcome, final, 0, 0)
