"""`llmfleet model-sync upload` against moto's S3: the download side reads back exactly what was
uploaded, a second run uploads nothing, bad input is one line and exit 2."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.cli.main import main
from apps.core.spec import load_spec
from apps.modelsync.s3 import Boto3ObjectStore
from apps.modelsync.sync import MARKER, ModelSyncError, SyncOutcome, sync_model
from apps.modelsync.upload import RemoteFile, UploadResult, upload_model
from tests.unit.s3_mock import mock_bucket

BUCKET = "llmfleet-models"
MODEL = "llama-3.1-8b-instruct"
FILES = {
    "config.json": b'{"num_hidden_layers": 32}',
    "model-00001-of-00002.safetensors": b"A" * 4096,
    "model-00002-of-00002.safetensors": b"B" * 1000,
    "tokenizer/tokenizer.json": b"{}",
    "empty.txt": b"",
}


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    monkeypatch.delenv("LLMFLEET_MODEL_BUCKET", raising=False)
    monkeypatch.delenv("LLMFLEET_S3_ENDPOINT_URL", raising=False)
    with mock_bucket(monkeypatch, BUCKET) as client:
        yield client


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    root = tmp_path / "weights"
    for rel, body in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(body)
    return root


class CountingStore:
    """The real store, counting uploads."""

    def __init__(self, inner: Boto3ObjectStore) -> None:
        self.inner = inner
        self.uploaded: list[str] = []

    def check_bucket(self, bucket: str) -> None:
        self.inner.check_bucket(bucket)

    def remote_files(self, bucket: str, prefix: str) -> Iterator[RemoteFile]:
        return self.inner.remote_files(bucket, prefix)

    def upload(self, bucket: str, key: str, source: Path, metadata: dict[str, str]) -> None:
        self.uploaded.append(key)
        self.inner.upload(bucket, key, source, metadata)


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_upload_then_the_init_container_copy_reads_it_back(s3: object, weights: Path, tmp_path: Path) -> None:
    store = Boto3ObjectStore(s3)  # type: ignore[arg-type]
    result = upload_model(store, BUCKET, MODEL, "rev1", weights)
    assert result == UploadResult(f"{MODEL}/rev1/", 5, 5, 0, sum(map(len, FILES.values())), 0)
    synced = sync_model(store, BUCKET, MODEL, "rev1", tmp_path / "cache")
    assert synced.outcome is SyncOutcome.COPIED
    copied = _tree(synced.path)
    assert copied.pop(MARKER)
    assert copied == FILES


def test_a_second_run_uploads_nothing_and_a_changed_file_is_sent_again(s3: object, weights: Path) -> None:
    store = CountingStore(Boto3ObjectStore(s3))  # type: ignore[arg-type]
    upload_model(store, BUCKET, MODEL, "rev1", weights)
    store.uploaded.clear()
    again = upload_model(store, BUCKET, MODEL, "rev1", weights)
    assert (again.uploaded, again.skipped, again.bytes_uploaded) == (0, 5, 0)
    assert store.uploaded == []
    (weights / "config.json").write_bytes(b'{"num_hidden_layers": 99}')  # same size, other content
    changed = upload_model(store, BUCKET, MODEL, "rev1", weights)
    assert store.uploaded == [f"{MODEL}/rev1/config.json"]
    assert (changed.uploaded, changed.skipped) == (1, 4)


def test_multipart_objects_are_recognised_by_their_checksum(s3: object, tmp_path: Path) -> None:
    root = tmp_path / "big"
    root.mkdir()
    (root / "model.safetensors").write_bytes(b"W" * (9 * 1024 * 1024))  # above boto3's 8 MiB multipart cut
    store = CountingStore(Boto3ObjectStore(s3))  # type: ignore[arg-type]
    upload_model(store, BUCKET, MODEL, "rev1", root)
    head = s3.head_object(Bucket=BUCKET, Key=f"{MODEL}/rev1/model.safetensors")  # type: ignore[attr-defined]
    assert "-" in head["ETag"]  # a multipart ETag is not the file's MD5
    assert head["Metadata"]["sha256"] == hashlib.sha256((root / "model.safetensors").read_bytes()).hexdigest()
    store.uploaded.clear()
    assert upload_model(store, BUCKET, MODEL, "rev1", root).skipped == 1
    assert store.uploaded == []


def test_objects_put_by_other_tools_are_skipped_when_their_md5_matches(s3: object, weights: Path) -> None:
    s3.put_object(Bucket=BUCKET, Key=f"{MODEL}/rev1/config.json", Body=FILES["config.json"])  # type: ignore[attr-defined]
    s3.put_object(Bucket=BUCKET, Key=f"{MODEL}/rev1/tokenizer/tokenizer.json", Body=b"[]")  # type: ignore[attr-defined]
    s3.put_object(Bucket=BUCKET, Key=f"{MODEL}/rev1/stale.bin", Body=b"old")  # type: ignore[attr-defined]
    store = CountingStore(Boto3ObjectStore(s3))  # type: ignore[arg-type]
    result = upload_model(store, BUCKET, MODEL, "rev1", weights)
    assert f"{MODEL}/rev1/config.json" not in store.uploaded
    assert f"{MODEL}/rev1/tokenizer/tokenizer.json" in store.uploaded  # same size, other bytes
    assert (result.skipped, result.extra) == (1, 1)  # nothing is deleted; the stray object is reported


def test_uploading_a_synced_cache_copy_leaves_out_the_marker(
    s3: object, weights: Path, tmp_path: Path
) -> None:
    store = Boto3ObjectStore(s3)  # type: ignore[arg-type]
    upload_model(store, BUCKET, MODEL, "rev1", weights)
    synced = sync_model(store, BUCKET, MODEL, "rev1", tmp_path / "cache")
    result = upload_model(store, BUCKET, "copy", "rev1", synced.path)
    assert (result.files, result.uploaded) == (5, 5)
    keys = {o.key for o in store.list_objects(BUCKET, "copy/rev1/")}
    assert f"copy/rev1/{MARKER}" not in keys


def test_symlinked_files_are_read_through_but_dangling_links_and_linked_dirs_refused(
    s3: object, weights: Path, tmp_path: Path
) -> None:
    store = Boto3ObjectStore(s3)  # type: ignore[arg-type]
    blob = tmp_path / "blob"
    blob.write_bytes(b"via link")
    (weights / "linked.json").symlink_to(blob)  # Hugging Face cache snapshots are links into blobs/
    upload_model(store, BUCKET, MODEL, "rev1", weights)
    body = s3.get_object(Bucket=BUCKET, Key=f"{MODEL}/rev1/linked.json")["Body"].read()  # type: ignore[attr-defined]
    assert body == b"via link"
    (weights / "dangling.json").symlink_to(tmp_path / "missing")
    with pytest.raises(ModelSyncError, match=r"dangling\.json: not a readable regular file"):
        upload_model(store, BUCKET, MODEL, "rev2", weights)
    (weights / "dangling.json").unlink()
    (weights / "more").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(ModelSyncError, match="more: symlinked directory, not followed"):
        upload_model(store, BUCKET, MODEL, "rev2", weights)
    assert not list(store.list_objects(BUCKET, f"{MODEL}/rev2/"))  # refused before anything is sent


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err.strip()


def test_cli_uploads_at_the_revision_of_the_stack(
    s3: object, weights: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    revision = load_spec("prod").models[MODEL].revision
    argv = [
        "model-sync",
        "upload",
        "--stack",
        "prod",
        "--model",
        MODEL,
        "--from",
        str(weights),
        "--bucket",
        BUCKET,
    ]
    code, out, _ = _cli(argv, capsys)
    assert code == 0
    record = json.loads(out)
    assert record["url"] == f"s3://{BUCKET}/{MODEL}/{revision}/"
    assert (record["uploaded"], record["skipped"]) == (5, 0)
    code, out, _ = _cli(argv, capsys)
    assert (code, json.loads(out)["uploaded"], json.loads(out)["skipped"]) == (0, 0, 5)
    # ... and the init container's own command finds it.
    dest = weights.parent / "cache"
    download = [
        "model-sync",
        "--bucket",
        BUCKET,
        "--model",
        MODEL,
        "--revision",
        revision,
        "--dest",
        str(dest),
    ]
    code, out, _ = _cli(download, capsys)
    assert (code, json.loads(out)["outcome"]) == (0, "copied")


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("unknown-model", "model 'no-such-model' is not in stack prod (known: "),
        ("missing-dir", "no such directory"),
        ("empty-dir", "no files to upload"),
        ("no-bucket-there", "s3://not-our-bucket: bucket not reachable (404)"),
        ("unknown-stack", "cannot read stack spec"),
        ("no-bucket-given", "no bucket: pass --bucket or set LLMFLEET_MODEL_BUCKET"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(
    s3: object, weights: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, expected: str
) -> None:
    model, source, bucket, stack = MODEL, weights, BUCKET, "prod"
    if case == "unknown-model":
        model = "no-such-model"
    elif case == "missing-dir":
        source = tmp_path / "nowhere"
    elif case == "empty-dir":
        source = tmp_path / "empty"
        (source / "sub").mkdir(parents=True)
    elif case == "no-bucket-there":
        bucket = "not-our-bucket"
    elif case == "unknown-stack":
        stack = "nosuchstack"
    argv = ["model-sync", "upload", "--stack", stack, "--model", model, "--from", str(source)]
    if case != "no-bucket-given":
        argv += ["--bucket", bucket]
    code, _, err = _cli(argv, capsys)
    assert code == 2
    assert "\n" not in err
    assert expected in err
    assert err.startswith("llmfleet model-sync: error: ")
    assert s3.list_objects_v2(Bucket=BUCKET).get("KeyCount", 0) == 0  # type: ignore[attr-defined]


def test_copy_without_model_or_revision_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli(["model-sync", "--bucket", BUCKET, "--model", MODEL], capsys)
    assert code == 2
    assert "--model and --revision are required" in err
