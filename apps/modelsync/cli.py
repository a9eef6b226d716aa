"""`llmfleet model-sync`: the init container of every vLLM pod on EKS, and its upload side.

`llmfleet model-sync --bucket B --model M --revision R` copies `s3://<bucket>/<model>/<revision>/`
to `<dest>/<model>/<revision>` (hostPath on the node's NVMe) and exits 0; a second pod on the
same node finds the completion marker and starts in seconds.

`llmfleet model-sync upload --stack prod --model M --from DIR --bucket B` puts a local weights
directory at `s3://<bucket>/<model>/<revision of M in the stack>/`, skipping files already there
with the same size and checksum. Errors are one line and exit 2 (via `LlmfleetError`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from apps.core.envnames import env_name
from apps.modelsync.settings import ModelSyncSettings
from apps.modelsync.sync import ModelSyncError, sync_model
from apps.modelsync.upload import upload_model

if TYPE_CHECKING:
    from apps.modelsync.s3 import Boto3ObjectStore

MISSING_EXTRA = (
    "boto3 is not installed: model-sync needs the modelsync extra (pip install 'llmfleet[modelsync]')"
)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bucket", help=f"S3 bucket of the models (env {env_name(ModelSyncSettings, 'model_bucket')})"
    )
    parser.add_argument(
        "--endpoint-url", help=f"S3 endpoint override (env {env_name(ModelSyncSettings, 's3_endpoint_url')})"
    )


def configure(parser: argparse.ArgumentParser) -> None:
    _common(parser)
    parser.add_argument("--model", help="model name, e.g. llama-3.1-8b-instruct (required to copy)")
    parser.add_argument("--revision", help="model revision (S3 prefix below the name; required to copy)")
    parser.add_argument(
        "--dest",
        type=Path,
        help=f"cache root (env {env_name(ModelSyncSettings, 'model_cache_dir')}, default /models)",
    )
    actions = parser.add_subparsers(dest="action", metavar="{upload}")
    upload = actions.add_parser(
        "upload",
        help="upload a local weights directory to s3://<bucket>/<model>/<revision>/",
        description="Upload DIR to s3://<bucket>/<model>/<revision>/ with the revision the stack spec "
        "names for the model; files already there with the same size and checksum are skipped.",
    )
    upload.add_argument("--stack", required=True, help="stack whose spec names the model (dev, prod)")
    upload.add_argument("--model", required=True, help="model name as in stacks/<stack>.yaml")
    upload.add_argument("--from", dest="source", type=Path, required=True, help="local weights directory")
    _common(upload)


def _log(msg: str, **fields: object) -> None:
    record = {"time": datetime.now(UTC).isoformat(), "level": "info", "msg": msg, **fields}
    print(json.dumps(record, default=str), file=sys.stdout, flush=True)


def _store(args: argparse.Namespace, settings: ModelSyncSettings) -> Boto3ObjectStore:
    try:  # the `modelsync` extra: only the model-sync image carries boto3
        import boto3

        from apps.modelsync.s3 import Boto3ObjectStore
    except ImportError:
        raise ModelSyncError(MISSING_EXTRA) from None
    client = boto3.client(
        "s3", endpoint_url=args.endpoint_url or settings.s3_endpoint_url, region_name=settings.aws_region
    )
    return Boto3ObjectStore(client)


def _bucket(args: argparse.Namespace, settings: ModelSyncSettings) -> str:
    bucket = args.bucket or settings.model_bucket
    if not bucket:
        name = env_name(ModelSyncSettings, "model_bucket")
        raise ModelSyncError(f"no bucket: pass --bucket or set {name}", param="bucket")
    return str(bucket)


@contextmanager
def _one_line_errors(url: str, local: Path) -> Iterator[None]:
    """S3 and file-system failures become one `ModelSyncError` line naming what failed."""
    from botocore.exceptions import BotoCoreError, ClientError  # present whenever `_store` succeeded

    try:
        yield
    except (BotoCoreError, ClientError) as exc:
        raise ModelSyncError(f"{url}: {exc}") from None
    except OSError as exc:
        raise ModelSyncError(f"{local}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    settings = ModelSyncSettings()
    if args.action == "upload":
        return _upload(args, settings)
    if not args.model or not args.revision:
        raise ModelSyncError(
            "--model and --revision are required to copy (to upload: model-sync upload)", param="model"
        )
    bucket = _bucket(args, settings)
    dest: Path = args.dest or settings.model_cache_dir
    store = _store(args, settings)
    started = time.monotonic()
    with _one_line_errors(f"s3://{bucket}/{args.model}/{args.revision}/", dest):
        result = sync_model(store, bucket, args.model, args.revision, dest)
    _log(
        "model sync finished",
        model=args.model,
        revision=args.revision,
        outcome=result.outcome.value,
        path=result.path,
        files=result.files,
        bytes=result.bytes,
        seconds=round(time.monotonic() - started, 3),
    )
    return 0


def _upload(args: argparse.Namespace, settings: ModelSyncSettings) -> int:
    from apps.core.spec import load_spec  # the init container never reads a stack spec

    spec = load_spec(args.stack)
    model = spec.models.get(args.model)
    if model is None:
        known = ", ".join(sorted(spec.models))
        raise ModelSyncError(
            f"model {args.model!r} is not in stack {spec.name} (known: {known})", param="model"
        )
    source: Path = args.source
    if not source.is_dir():
        raise ModelSyncError(f"--from {source}: no such directory", param="from")
    bucket = _bucket(args, settings)
    store = _store(args, settings)
    started = time.monotonic()
    with _one_line_errors(f"s3://{bucket}/{args.model}/{model.revision}/", source):
        result = upload_model(store, bucket, args.model, model.revision, source)
    _log(
        "model upload finished",
        model=args.model,
        revision=model.revision,
        url=f"s3://{bucket}/{result.prefix}",
        files=result.files,
        uploaded=result.uploaded,
        skipped=result.skipped,
        bytes_uploaded=result.bytes_uploaded,
        extra=result.extra,
        seconds=round(time.monotonic() - started, 3),
    )
    if result.extra:
        print(
            f"llmfleet model-sync upload: warning: {result.extra} object(s) under s3://{bucket}/{result.prefix} "
            "are not in the directory; the init containers copy them too",
            file=sys.stderr,
        )
    return 0
