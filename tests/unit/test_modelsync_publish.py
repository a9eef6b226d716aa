"""`llmfleet model publish` against moto's S3: the init container's copy reads back exactly what was
published, an interrupted publish resumes, a published revision is never written again, bad input
is one line and exit 2."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apps.cli.main import main
from apps.core.sizing.plan import plan_fleet
from apps.core.spec import load_spec
from apps.modelsync.manifest import MANIFEST_NAME
from apps.modelsync.publish import AlreadyPublished, PublishResult, publish_model
from apps.modelsync.s3 import Boto3ObjectStore
from apps.modelsync.signing import unseal
from apps.modelsync.sync import MARKER, ModelSyncError, SyncOutcome, sync_model
from apps.modelsync.upload import RemoteFile, UploadResult
from tests.unit.s3_mock import KeyPair, key_pair, mock_bucket

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
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with mock_bucket(monkeypatch, BUCKET) as client:
        yield client


@pytest.fixture
def keys(tmp_path: Path) -> KeyPair:
    return key_pair(tmp_path)


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    root = tmp_path / "weights"
    for rel, body in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(body)
    return root


class CountingStore:
    """The real store, counting uploads; `manifest_taken`: another publisher wins the conditional write."""

    def __init__(self, inner: Boto3ObjectStore, manifest_taken: bool = False) -> None:
        self.inner = inner
        self.uploaded: list[str] = []
        self.manifest_taken = manifest_taken

    def check_bucket(self, bucket: str) -> None:
        self.inner.check_bucket(bucket)

    def remote_files(self, bucket: str, prefix: str) -> Iterator[RemoteFile]:
        return self.inner.remote_files(bucket, prefix)

    def upload(self, bucket: str, key: str, source: Path, metadata: dict[str, str]) -> None:
        self.uploaded.append(key)
        self.inner.upload(bucket, key, source, metadata)

    def put_bytes(self, bucket: str, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        if self.manifest_taken:
            self.inner.put_bytes(bucket, key, b'{"theirs": true}')
        return self.inner.put_bytes(bucket, key, data, if_absent=if_absent)


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _publish(store: Any, keys: KeyPair, root: Path, revision: str = "rev1") -> PublishResult:
    return publish_model(store, keys.signer, BUCKET, MODEL, revision, root, {"stack": "test"})


def test_publish_then_the_init_container_copy_reads_it_back(
    s3: Any, keys: KeyPair, weights: Path, tmp_path: Path
) -> None:
    store = Boto3ObjectStore(s3)
    result = _publish(store, keys, weights)
    assert result.upload == UploadResult(f"{MODEL}/rev1/", 5, 5, 0, sum(map(len, FILES.values())))
    manifest = result.manifest
    assert (manifest.model, manifest.revision, manifest.serving) == (MODEL, "rev1", {"stack": "test"})
    assert {f.path: f.size for f in manifest.files} == {rel: len(body) for rel, body in FILES.items()}
    assert {f.path: f.sha256 for f in manifest.files}["config.json"] == hashlib.sha256(
        FILES["config.json"]
    ).hexdigest()
    assert manifest.tokenizer == ("tokenizer/tokenizer.json",)
    raw = s3.get_object(Bucket=BUCKET, Key=f"{MODEL}/rev1/{MANIFEST_NAME}")["Body"].read()
    assert unseal(raw, keys.verifier, "here") == manifest
    synced = sync_model(store, keys.verifier, BUCKET, MODEL, "rev1", tmp_path / "cache")
    assert synced.outcome is SyncOutcome.COPIED
    copied = _tree(synced.path)
    assert copied.pop(MARKER)
    assert copied == FILES  # the manifest is the registry's, not the engine's


def test_an_interrupted_publish_resumes_and_uploads_only_what_is_missing(
    s3: Any, keys: KeyPair, weights: Path
) -> None:
    store = CountingStore(Boto3ObjectStore(s3))
    s3.put_object(Bucket=BUCKET, Key=f"{MODEL}/rev1/config.json", Body=FILES["config.json"])  # a first try
    result = _publish(store, keys, weights)
    assert f"{MODEL}/rev1/config.json" not in store.uploaded  # the same bytes: skipped
    assert (result.upload.uploaded, result.upload.skipped) == (4, 1)


def test_a_published_revision_is_never_written_again(s3: Any, keys: KeyPair, weights: Path) -> None:
    _publish(Boto3ObjectStore(s3), keys, weights)
    before = s3.get_object(Bucket=BUCKET, Key=f"{MODEL}/rev1/{MANIFEST_NAME}")["Body"].read()
    (weights / "config.json").write_bytes(b'{"num_hidden_layers": 99}')
    store = CountingStore(Boto3ObjectStore(s3))
    with pytest.raises(AlreadyPublished, match=r"already published .* publish under a new revision"):
        _publish(store, keys, weights)
    assert store.uploaded == []  # refused before anything is sent
    assert (
        s3.get_object(Bucket=BUCKET, Key=f"{MODEL}/rev1/config.json")["Body"].read() == FILES["config.json"]
    )
    assert s3.get_object(Bucket=BUCKET, Key=f"{MODEL}/rev1/{MANIFEST_NAME}")["Body"].read() == before
    assert _publish(store, keys, weights, "rev2").upload.uploaded == 5  # a new revision is the way


def test_of_two_publishers_racing_on_one_revision_the_second_is_told(
    s3: Any, keys: KeyPair, weights: Path
) -> None:
    store = CountingStore(Boto3ObjectStore(s3), manifest_taken=True)
    with pytest.raises(AlreadyPublished, match="published meanwhile by someone else"):
        _publish(store, keys, weights)
    # S3's conditional write kept the winner's manifest.
    assert (
        s3.get_object(Bucket=BUCKET, Key=f"{MODEL}/rev1/{MANIFEST_NAME}")["Body"].read()
        == b'{"theirs": true}'
    )


def test_objects_the_directory_does_not_have_stop_the_publish(s3: Any, keys: KeyPair, weights: Path) -> None:
    s3.put_object(Bucket=BUCKET, Key=f"{MODEL}/rev1/stale.bin", Body=b"old")
    store = CountingStore(Boto3ObjectStore(s3))
    with pytest.raises(ModelSyncError, match=r"stale\.bin is not in .*a revision holds exactly its files"):
        _publish(store, keys, weights)
    assert store.uploaded == []


def test_multipart_objects_are_recognised_by_their_checksum(s3: Any, keys: KeyPair, tmp_path: Path) -> None:
    root = tmp_path / "big"
    root.mkdir()
    (root / "model.safetensors").write_bytes(b"W" * (9 * 1024 * 1024))  # above boto3's 8 MiB multipart cut
    store = CountingStore(Boto3ObjectStore(s3))
    result = _publish(store, keys, root)
    head = s3.head_object(Bucket=BUCKET, Key=f"{MODEL}/rev1/model.safetensors")
    assert "-" in head["ETag"]  # a multipart ETag is not the file's MD5
    sha = hashlib.sha256((root / "model.safetensors").read_bytes()).hexdigest()
    assert head["Metadata"]["sha256"] == sha == result.manifest.files[0].sha256


def test_objects_put_by_other_tools_are_skipped_when_their_md5_matches(
    s3: Any, keys: KeyPair, weights: Path
) -> None:
    s3.put_object(Bucket=BUCKET, Key=f"{MODEL}/rev1/config.json", Body=FILES["config.json"])
    s3.put_object(Bucket=BUCKET, Key=f"{MODEL}/rev1/tokenizer/tokenizer.json", Body=b"[]")
    store = CountingStore(Boto3ObjectStore(s3))
    result = _publish(store, keys, weights)
    assert f"{MODEL}/rev1/config.json" not in store.uploaded
    assert f"{MODEL}/rev1/tokenizer/tokenizer.json" in store.uploaded  # same size, other bytes
    assert result.upload.skipped == 1


def test_publishing_a_synced_cache_copy_leaves_out_the_marker(
    s3: Any, keys: KeyPair, weights: Path, tmp_path: Path
) -> None:
    store = Boto3ObjectStore(s3)
    _publish(store, keys, weights)
    synced = sync_model(store, keys.verifier, BUCKET, MODEL, "rev1", tmp_path / "cache")
    result = publish_model(store, keys.signer, BUCKET, "copy", "rev1", synced.path, {})
    assert (result.upload.files, result.upload.uploaded) == (5, 5)
    keys_there = {o.key for o in store.list_objects(BUCKET, "copy/rev1/")}
    assert f"copy/rev1/{MARKER}" not in keys_there


def test_symlinked_files_are_read_through_but_dangling_links_and_linked_dirs_refused(
    s3: Any, keys: KeyPair, weights: Path, tmp_path: Path
) -> None:
    store = Boto3ObjectStore(s3)
    blob = tmp_path / "blob"
    blob.write_bytes(b"via link")
    (weights / "linked.json").symlink_to(blob)  # Hugging Face cache snapshots are links into blobs/
    _publish(store, keys, weights)
    assert s3.get_object(Bucket=BUCKET, Key=f"{MODEL}/rev1/linked.json")["Body"].read() == b"via link"
    (weights / "dangling.json").symlink_to(tmp_path / "missing")
    with pytest.raises(ModelSyncError, match=r"dangling\.json: not a readable regular file"):
        _publish(store, keys, weights, "rev2")
    (weights / "dangling.json").unlink()
    (weights / "more").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(ModelSyncError, match="more: symlinked directory, not followed"):
        _publish(store, keys, weights, "rev2")
    assert not list(store.list_objects(BUCKET, f"{MODEL}/rev2/"))  # refused before anything is sent


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err.strip()


def test_cli_publishes_with_a_new_local_key_and_model_sync_verifies_with_its_public_half(
    s3: Any,
    weights: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    key = tmp_path / "dev-signing.pem"
    argv = ["model", "publish", "--model", MODEL, "--revision", "r1", "--from", str(weights)]
    argv += ["--stack", "prod", "--bucket", BUCKET, "--signing-key", str(key)]
    code, out, err = _cli(argv, capsys)
    assert code == 0, err
    record = json.loads(out)
    assert record["url"] == f"s3://{BUCKET}/{MODEL}/r1/"
    assert (record["uploaded"], record["signed_by"]) == (5, "local:dev-signing.pem")
    assert key.stat().st_mode & 0o777 == 0o600  # created, private
    assert record["verify_key"] == f"{key}.pub"
    raw = s3.get_object(Bucket=BUCKET, Key=f"{MODEL}/r1/{MANIFEST_NAME}")["Body"].read()
    plan = plan_fleet(load_spec("prod")).models[MODEL]
    serving = json.loads(raw)["manifest"]["serving"]
    assert (serving["stack"], serving["max_model_len"], serving["max_num_seqs"]) == (
        "prod",
        plan.max_model_len,
        plan.max_num_seqs,
    )
    code, _, err = _cli(argv, capsys)  # the same revision again
    assert code == 2
    assert "already published" in err
    # ... and the init container's own command verifies it with the public half.
    monkeypatch.setenv("LLMFLEET_MODEL_VERIFY_KEY", f"{key}.pub")
    download = [
        "model-sync",
        "--bucket",
        BUCKET,
        "--model",
        MODEL,
        "--revision",
        "r1",
        "--dest",
        str(tmp_path / "c"),
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
        (
            "no-key-given",
            "no signing key: pass --kms-key-id (or set LLMFLEET_MODEL_SIGNING_KEY) or --signing-key",
        ),
        ("our-name", "llmfleet-manifest.json is a name of the platform's own"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(
    s3: Any, weights: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, expected: str
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
    elif case == "our-name":
        (weights / MANIFEST_NAME).write_bytes(b"{}")
    argv = ["model", "publish", "--stack", stack, "--model", model, "--revision", "r1", "--from", str(source)]
    if case != "no-bucket-given":
        argv += ["--bucket", bucket]
    if case != "no-key-given":
        argv += ["--signing-key", str(tmp_path / "k.pem")]
    code, _, err = _cli(argv, capsys)
    assert code == 2
    assert "\n" not in err
    assert expected in err
    assert err.startswith("llmfleet model: error: ")
    assert s3.list_objects_v2(Bucket=BUCKET).get("KeyCount", 0) == 0


def test_copy_without_model_or_revision_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli(["model-sync", "--bucket", BUCKET, "--model", MODEL], capsys)
    assert code == 2
    assert "--model and --revision are required" in err


def test_cli_revision_defaults_to_the_stacks_and_is_required_without_one(
    s3: Any, weights: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["model", "publish", "--model", MODEL, "--from", str(weights), "--bucket", BUCKET]
    base += ["--signing-key", str(tmp_path / "k.pem")]
    code, _, err = _cli(base, capsys)
    assert (code, err) == (
        2,
        "llmfleet model: error: --revision is required (or --stack, whose spec names it)",
    )
    code, out, _ = _cli([*base, "--stack", "prod"], capsys)
    assert code == 0
    assert json.loads(out)["revision"] == load_spec("prod").models[MODEL].revision
