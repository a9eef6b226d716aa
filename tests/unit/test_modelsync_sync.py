"""model-sync against moto's S3: copy once, skip on the marker, never look complete when partial, and
never copy a revision that is unsigned, signed by another key, or not what its signed manifest lists."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apps.cli.main import main
from apps.modelsync.manifest import MANIFEST_NAME, ManifestError
from apps.modelsync.publish import publish_model
from apps.modelsync.s3 import Boto3ObjectStore
from apps.modelsync.sync import (
    MARKER,
    STALE_PARTIAL_S,
    ModelSyncError,
    RemoteObject,
    SyncOutcome,
    SyncResult,
    sync_model,
)
from tests.unit.s3_mock import KeyPair, key_pair, mock_bucket

BUCKET = "llmfleet-models"
FILES = {
    "config.json": b'{"layers": 32}',
    "model-00001-of-00002.safetensors": b"A" * 4096,
    "model-00002-of-00002.safetensors": b"B" * 1000,
    "tokenizer/tokenizer.json": b"{}",
}


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> KeyPair:
    return key_pair(tmp_path_factory.mktemp("keys"))


def _publish(client: Any, keys: KeyPair, revision: str, files: dict[str, bytes], root: Path) -> None:
    for rel, body in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(body)
    store = Boto3ObjectStore(client)
    publish_model(store, keys.signer, BUCKET, "llama", revision, root, {})


@pytest.fixture
def s3(
    monkeypatch: pytest.MonkeyPatch, keys: KeyPair, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """rev1 (FILES) and rev2 published and signed with `keys`; the CLI verifies with its public half."""
    monkeypatch.setenv("LLMFLEET_MODEL_VERIFY_KEY", str(keys.public))
    with mock_bucket(monkeypatch, BUCKET) as client:
        _publish(client, keys, "rev1", FILES, tmp_path_factory.mktemp("rev1"))
        _publish(client, keys, "rev2", {"config.json": b"other"}, tmp_path_factory.mktemp("rev2"))
        yield client


def sync(store: object, keys: KeyPair, *args: object, **kwargs: object) -> SyncResult:
    return sync_model(store, keys.verifier, *args, **kwargs)


class CountingStore:
    """Wraps the real store and counts downloads; optionally fails on the n-th one."""

    def __init__(self, inner: Boto3ObjectStore, fail_on: int | None = None) -> None:
        self.inner = inner
        self.fail_on = fail_on
        self.downloads = 0

    def list_objects(self, bucket: str, prefix: str) -> Iterator[RemoteObject]:
        return self.inner.list_objects(bucket, prefix)

    def get_bytes(self, bucket: str, key: str) -> bytes | None:
        return self.inner.get_bytes(bucket, key)

    def download(self, bucket: str, key: str, dest: Path) -> None:
        self.downloads += 1
        if self.fail_on is not None and self.downloads == self.fail_on:
            dest.write_bytes(b"half")
            raise ConnectionError("connection reset mid-copy")
        self.inner.download(bucket, key, dest)


def test_copies_every_file_and_writes_the_marker_last(s3: Any, keys: KeyPair, tmp_path: Path) -> None:
    store = CountingStore(Boto3ObjectStore(s3))
    result = sync(store, keys, BUCKET, "llama", "rev1", tmp_path)
    assert result.outcome is SyncOutcome.COPIED
    assert result.files == len(FILES)
    assert result.bytes == sum(len(b) for b in FILES.values())
    final = tmp_path / "llama" / "rev1"
    for rel, body in FILES.items():
        assert (final / rel).read_bytes() == body
    assert (final / MARKER).is_file()
    # only the final directory is left: no temporary directories
    assert sorted(p.name for p in (tmp_path / "llama").iterdir()) == ["rev1"]


def test_second_run_skips_without_downloading(s3: Any, keys: KeyPair, tmp_path: Path) -> None:
    sync(Boto3ObjectStore(s3), keys, BUCKET, "llama", "rev1", tmp_path)
    store = CountingStore(Boto3ObjectStore(s3))
    result = sync(store, keys, BUCKET, "llama", "rev1", tmp_path)
    assert result.outcome is SyncOutcome.SKIPPED
    assert store.downloads == 0
    assert result.files == len(FILES)


def test_a_new_revision_is_copied_next_to_the_old_one(s3: Any, keys: KeyPair, tmp_path: Path) -> None:
    sync(Boto3ObjectStore(s3), keys, BUCKET, "llama", "rev1", tmp_path)
    result = sync(Boto3ObjectStore(s3), keys, BUCKET, "llama", "rev2", tmp_path)
    assert result.outcome is SyncOutcome.COPIED
    assert (tmp_path / "llama" / "rev2" / "config.json").read_bytes() == b"other"
    assert (tmp_path / "llama" / "rev1" / MARKER).is_file()


def test_a_failed_copy_never_looks_complete_and_the_retry_finishes(
    s3: Any, keys: KeyPair, tmp_path: Path
) -> None:
    failing = CountingStore(Boto3ObjectStore(s3), fail_on=3)
    with pytest.raises(ConnectionError):
        sync(failing, keys, BUCKET, "llama", "rev1", tmp_path)
    assert not (tmp_path / "llama" / "rev1").exists()
    assert list((tmp_path / "llama").iterdir()) == []  # the partial directory is gone too
    result = sync(Boto3ObjectStore(s3), keys, BUCKET, "llama", "rev1", tmp_path)
    assert result.outcome is SyncOutcome.COPIED
    assert (tmp_path / "llama" / "rev1" / MARKER).is_file()


def test_a_directory_without_marker_is_replaced(s3: Any, keys: KeyPair, tmp_path: Path) -> None:
    stale = tmp_path / "llama" / "rev1"
    stale.mkdir(parents=True)
    (stale / "config.json").write_bytes(b"truncated")
    result = sync(Boto3ObjectStore(s3), keys, BUCKET, "llama", "rev1", tmp_path)
    assert result.outcome is SyncOutcome.COPIED
    assert (stale / "config.json").read_bytes() == FILES["config.json"]


def test_missing_revision_is_a_clear_error(s3: Any, keys: KeyPair, tmp_path: Path) -> None:
    with pytest.raises(ModelSyncError, match=r"no objects under s3://llmfleet-models/llama/nope/"):
        sync(Boto3ObjectStore(s3), keys, BUCKET, "llama", "nope", tmp_path)


@pytest.mark.parametrize(("name", "revision"), [("..", "rev1"), ("llama", "../x"), (".hidden", "r")])
def test_unsafe_names_are_refused(s3: Any, keys: KeyPair, tmp_path: Path, name: str, revision: str) -> None:
    with pytest.raises(ModelSyncError, match="not a valid path component"):
        sync(Boto3ObjectStore(s3), keys, BUCKET, name, revision, tmp_path)


def _sync_argv(revision: str, dest: Path) -> list[str]:
    return ["model-sync", "--bucket", BUCKET, "--model", "llama", "--revision", revision, "--dest", str(dest)]


def test_cli_copies_then_skips(
    s3: Any, keys: KeyPair, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _sync_argv("rev1", tmp_path)
    assert main(argv) == 0
    assert '"outcome": "copied"' in capsys.readouterr().out
    assert main(argv) == 0
    assert '"outcome": "skipped"' in capsys.readouterr().out


def test_cli_error_is_one_line_and_exit_2(
    s3: Any, keys: KeyPair, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _sync_argv("nope", tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "no objects under" in err


def test_leftovers_of_killed_copies_are_removed_only_when_stale(
    s3: Any, keys: KeyPair, tmp_path: Path
) -> None:
    parent = tmp_path / "llama"
    stale = parent / ".rev1.partial-dead"
    fresh = parent / ".rev1.partial-live"
    other = parent / ".rev2.partial-dead"
    for d in (stale, fresh, other):
        d.mkdir(parents=True)
        (d / "config.json").write_bytes(b"half")
    now = 1_000_000.0
    os.utime(stale, (now - STALE_PARTIAL_S - 1, now - STALE_PARTIAL_S - 1))
    os.utime(other, (now - STALE_PARTIAL_S - 1, now - STALE_PARTIAL_S - 1))
    os.utime(fresh, (now - 60, now - 60))
    result = sync(Boto3ObjectStore(s3), keys, BUCKET, "llama", "rev1", tmp_path, now=now)
    assert result.outcome is SyncOutcome.COPIED
    assert not stale.exists()
    assert fresh.exists()  # a copy in progress on another pod is left alone
    assert other.exists()  # other revisions are not this copy's business


class RacingStore(CountingStore):
    """Another pod on the node finishes the same revision while this copy is running."""

    def __init__(self, inner: Boto3ObjectStore, root: Path, keys: KeyPair) -> None:
        super().__init__(inner)
        self.root = root
        self.keys = keys

    def download(self, bucket: str, key: str, dest: Path) -> None:
        super().download(bucket, key, dest)
        if self.downloads == 1:
            sync(self.inner, self.keys, bucket, "llama", "rev1", self.root)


def test_losing_a_race_with_another_pod_is_a_skip(s3: Any, keys: KeyPair, tmp_path: Path) -> None:
    store = RacingStore(Boto3ObjectStore(s3), tmp_path, keys)
    result = sync(store, keys, BUCKET, "llama", "rev1", tmp_path)
    assert result.outcome is SyncOutcome.SKIPPED
    assert (tmp_path / "llama" / "rev1" / MARKER).is_file()
    assert sorted(p.name for p in (tmp_path / "llama").iterdir()) == ["rev1"]


# -- what is refused: nothing is copied, nothing looks complete, one line says why -------------------


def _refused(s3: Any, keys: KeyPair, tmp_path: Path, revision: str = "rev1") -> str:
    with pytest.raises(ManifestError) as refused:
        sync(Boto3ObjectStore(s3), keys, BUCKET, "llama", revision, tmp_path)
    assert not (tmp_path / "llama" / revision).exists()
    assert not list((tmp_path / "llama").glob(f".{revision}.partial-*"))
    assert "\n" not in refused.value.message
    return refused.value.message


def test_an_unsigned_revision_is_refused(s3: Any, keys: KeyPair, tmp_path: Path) -> None:
    s3.put_object(
        Bucket=BUCKET, Key="llama/plain/config.json", Body=b"{}"
    )  # uploaded by hand, never published
    assert "unsigned revision (no llmfleet-manifest.json)" in _refused(s3, keys, tmp_path, "plain")


def test_a_tampered_file_is_refused(s3: Any, keys: KeyPair, tmp_path: Path) -> None:
    s3.put_object(Bucket=BUCKET, Key="llama/rev1/config.json", Body=b'{"layers": 33}')  # same size
    message = _refused(s3, keys, tmp_path)
    assert "config.json: its SHA-256 differs from the signed manifest's" in message


def test_a_file_of_another_size_is_refused(s3: Any, keys: KeyPair, tmp_path: Path) -> None:
    s3.put_object(Bucket=BUCKET, Key="llama/rev1/model-00002-of-00002.safetensors", Body=b"B" * 999)
    assert "got 999 bytes, the signed manifest says 1000" in _refused(s3, keys, tmp_path)


def test_a_file_the_manifest_does_not_list_is_refused(s3: Any, keys: KeyPair, tmp_path: Path) -> None:
    s3.put_object(Bucket=BUCKET, Key="llama/rev1/extra.py", Body=b"import os")
    assert "extra.py is not in the signed manifest" in _refused(s3, keys, tmp_path)


def test_a_listed_file_missing_from_the_bucket_is_refused(s3: Any, keys: KeyPair, tmp_path: Path) -> None:
    s3.delete_object(Bucket=BUCKET, Key="llama/rev1/tokenizer/tokenizer.json")
    assert "tokenizer/tokenizer.json is in the signed manifest but not in the bucket" in _refused(
        s3, keys, tmp_path
    )


def test_a_manifest_edited_after_signing_is_refused(s3: Any, keys: KeyPair, tmp_path: Path) -> None:
    key = f"llama/rev1/{MANIFEST_NAME}"
    envelope = json.loads(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    envelope["manifest"]["files"][0]["sha256"] = "0" * 64  # to pass off another file as the signed one
    s3.put_object(Bucket=BUCKET, Key=key, Body=json.dumps(envelope).encode())
    assert "signature does not verify with the configured key" in _refused(s3, keys, tmp_path)


def test_a_revision_signed_by_another_key_is_refused(s3: Any, keys: KeyPair, tmp_path: Path) -> None:
    other = key_pair(tmp_path)
    weights = tmp_path / "weights"
    (weights / "config.json").parent.mkdir(parents=True)
    (weights / "config.json").write_bytes(b"{}")
    publish_model(Boto3ObjectStore(s3), other.signer, BUCKET, "llama", "rev9", weights, {})
    assert "does not verify with the configured key" in _refused(s3, keys, tmp_path / "cache", "rev9")


def test_another_revisions_manifest_is_refused(s3: Any, keys: KeyPair, tmp_path: Path) -> None:
    """A validly signed manifest copied onto another revision's prefix (a replay) names its own."""
    rev2 = s3.get_object(Bucket=BUCKET, Key=f"llama/rev2/{MANIFEST_NAME}")["Body"].read()
    s3.put_object(Bucket=BUCKET, Key=f"llama/rev1/{MANIFEST_NAME}", Body=rev2)
    assert "signed for llama rev2, not llama rev1" in _refused(s3, keys, tmp_path)


def test_cli_refusal_is_one_line_and_exit_2(
    s3: Any, keys: KeyPair, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s3.put_object(Bucket=BUCKET, Key="llama/rev1/extra.bin", Body=b"x")
    assert main(_sync_argv("rev1", tmp_path)) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err.startswith("llmfleet model-sync: error: s3://llmfleet-models/llama/rev1/: extra.bin")
    assert not (tmp_path / "llama" / "rev1").exists()


def test_cli_without_a_key_to_verify_with_refuses(
    s3: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("LLMFLEET_MODEL_VERIFY_KEY")
    monkeypatch.delenv("LLMFLEET_MODEL_SIGNING_KEY", raising=False)
    assert main(_sync_argv("rev1", tmp_path)) == 2
    assert "no key to verify the revision's manifest with" in capsys.readouterr().err
    assert not (tmp_path / "llama").exists()
