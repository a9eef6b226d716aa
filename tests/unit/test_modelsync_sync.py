"""model-sync against moto's S3: copy once, skip on the marker, never look complete when partial."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.cli.main import main
from apps.modelsync.s3 import Boto3ObjectStore
from apps.modelsync.sync import MARKER, STALE_PARTIAL_S, ModelSyncError, RemoteObject, SyncOutcome, sync_model
from tests.unit.s3_mock import mock_bucket

BUCKET = "llmfleet-models"
FILES = {
    "config.json": b'{"layers": 32}',
    "model-00001-of-00002.safetensors": b"A" * 4096,
    "model-00002-of-00002.safetensors": b"B" * 1000,
    "tokenizer/tokenizer.json": b"{}",
}


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    with mock_bucket(monkeypatch, BUCKET) as client:
        for rel, body in FILES.items():
            client.put_object(Bucket=BUCKET, Key=f"llama/rev1/{rel}", Body=body)
        client.put_object(Bucket=BUCKET, Key="llama/rev2/config.json", Body=b"other")
        yield client


class CountingStore:
    """Wraps the real store and counts downloads; optionally fails on the n-th one."""

    def __init__(self, inner: Boto3ObjectStore, fail_on: int | None = None) -> None:
        self.inner = inner
        self.fail_on = fail_on
        self.downloads = 0

    def list_objects(self, bucket: str, prefix: str) -> Iterator[RemoteObject]:
        return self.inner.list_objects(bucket, prefix)

    def download(self, bucket: str, key: str, dest: Path) -> None:
        self.downloads += 1
        if self.fail_on is not None and self.downloads == self.fail_on:
            dest.write_bytes(b"half")
            raise ConnectionError("connection reset mid-copy")
        self.inner.download(bucket, key, dest)


def test_copies_every_file_and_writes_the_marker_last(s3: object, tmp_path: Path) -> None:
    store = CountingStore(Boto3ObjectStore(s3))  # type: ignore[arg-type]
    result = sync_model(store, BUCKET, "llama", "rev1", tmp_path)
    assert result.outcome is SyncOutcome.COPIED
    assert result.files == len(FILES)
    assert result.bytes == sum(len(b) for b in FILES.values())
    final = tmp_path / "llama" / "rev1"
    for rel, body in FILES.items():
        assert (final / rel).read_bytes() == body
    assert (final / MARKER).is_file()
    # only the final directory is left: no temporary directories
    assert sorted(p.name for p in (tmp_path / "llama").iterdir()) == ["rev1"]


def test_second_run_skips_without_downloading(s3: object, tmp_path: Path) -> None:
    sync_model(Boto3ObjectStore(s3), BUCKET, "llama", "rev1", tmp_path)  # type: ignore[arg-type]
    store = CountingStore(Boto3ObjectStore(s3))  # type: ignore[arg-type]
    result = sync_model(store, BUCKET, "llama", "rev1", tmp_path)
    assert result.outcome is SyncOutcome.SKIPPED
    assert store.downloads == 0
    assert result.files == len(FILES)


def test_a_new_revision_is_copied_next_to_the_old_one(s3: object, tmp_path: Path) -> None:
    sync_model(Boto3ObjectStore(s3), BUCKET, "llama", "rev1", tmp_path)  # type: ignore[arg-type]
    result = sync_model(Boto3ObjectStore(s3), BUCKET, "llama", "rev2", tmp_path)  # type: ignore[arg-type]
    assert result.outcome is SyncOutcome.COPIED
    assert (tmp_path / "llama" / "rev2" / "config.json").read_bytes() == b"other"
    assert (tmp_path / "llama" / "rev1" / MARKER).is_file()


def test_a_failed_copy_never_looks_complete_and_the_retry_finishes(s3: object, tmp_path: Path) -> None:
    failing = CountingStore(Boto3ObjectStore(s3), fail_on=3)  # type: ignore[arg-type]
    with pytest.raises(ConnectionError):
        sync_model(failing, BUCKET, "llama", "rev1", tmp_path)
    assert not (tmp_path / "llama" / "rev1").exists()
    assert list((tmp_path / "llama").iterdir()) == []  # the partial directory is gone too
    result = sync_model(Boto3ObjectStore(s3), BUCKET, "llama", "rev1", tmp_path)  # type: ignore[arg-type]
    assert result.outcome is SyncOutcome.COPIED
    assert (tmp_path / "llama" / "rev1" / MARKER).is_file()


def test_a_directory_without_marker_is_replaced(s3: object, tmp_path: Path) -> None:
    stale = tmp_path / "llama" / "rev1"
    stale.mkdir(parents=True)
    (stale / "config.json").write_bytes(b"truncated")
    result = sync_model(Boto3ObjectStore(s3), BUCKET, "llama", "rev1", tmp_path)  # type: ignore[arg-type]
    assert result.outcome is SyncOutcome.COPIED
    assert (stale / "config.json").read_bytes() == FILES["config.json"]


def test_missing_revision_is_a_clear_error(s3: object, tmp_path: Path) -> None:
    with pytest.raises(ModelSyncError, match=r"no objects under s3://llmfleet-models/llama/nope/"):
        sync_model(Boto3ObjectStore(s3), BUCKET, "llama", "nope", tmp_path)  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "revision"), [("..", "rev1"), ("llama", "../x"), (".hidden", "r")])
def test_unsafe_names_are_refused(s3: object, tmp_path: Path, name: str, revision: str) -> None:
    with pytest.raises(ModelSyncError, match="not a valid path component"):
        sync_model(Boto3ObjectStore(s3), BUCKET, name, revision, tmp_path)  # type: ignore[arg-type]


def _sync_argv(revision: str, dest: Path) -> list[str]:
    return ["model-sync", "--bucket", BUCKET, "--model", "llama", "--revision", revision, "--dest", str(dest)]


def test_cli_copies_then_skips(s3: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = _sync_argv("rev1", tmp_path)
    assert main(argv) == 0
    assert '"outcome": "copied"' in capsys.readouterr().out
    assert main(argv) == 0
    assert '"outcome": "skipped"' in capsys.readouterr().out


def test_cli_error_is_one_line_and_exit_2(
    s3: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _sync_argv("nope", tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "no objects under" in err


def test_leftovers_of_killed_copies_are_removed_only_when_stale(s3: object, tmp_path: Path) -> None:
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
    result = sync_model(Boto3ObjectStore(s3), BUCKET, "llama", "rev1", tmp_path, now=now)  # type: ignore[arg-type]
    assert result.outcome is SyncOutcome.COPIED
    assert not stale.exists()
    assert fresh.exists()  # a copy in progress on another pod is left alone
    assert other.exists()  # other revisions are not this copy's business


class RacingStore(CountingStore):
    """Another pod on the node finishes the same revision while this copy is running."""

    def __init__(self, inner: Boto3ObjectStore, root: Path) -> None:
        super().__init__(inner)
        self.root = root

    def download(self, bucket: str, key: str, dest: Path) -> None:
        super().download(bucket, key, dest)
        if self.downloads == 1:
            sync_model(self.inner, bucket, "llama", "rev1", self.root)


def test_losing_a_race_with_another_pod_is_a_skip(s3: object, tmp_path: Path) -> None:
    store = RacingStore(Boto3ObjectStore(s3), tmp_path)  # type: ignore[arg-type]
    result = sync_model(store, BUCKET, "llama", "rev1", tmp_path)
    assert result.outcome is SyncOutcome.SKIPPED
    assert (tmp_path / "llama" / "rev1" / MARKER).is_file()
    assert sorted(p.name for p in (tmp_path / "llama").iterdir()) == ["rev1"]
