"""`llmfleet model-sync`: the init container of every vLLM pod on EKS.

Copies `s3://<bucket>/<model>/<revision>/` to `<dest>/<model>/<revision>` (hostPath on the
node's NVMe) and exits 0; a second pod on the same node finds the completion marker and
starts in seconds. Errors are one line and exit 2 (via `LlmfleetError`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict

from apps.modelsync.s3 import Boto3ObjectStore
from apps.modelsync.sync import ModelSyncError, sync_model

MISSING_EXTRA = (
    "boto3 is not installed: model-sync needs the modelsync extra (pip install 'llmfleet[modelsync]')"
)


class ModelSyncSettings(BaseSettings):
    """Environment defaults (`LLMFLEET_MODEL_BUCKET`, ...); flags win over them."""

    model_config = SettingsConfigDict(env_prefix="LLMFLEET_")

    model_bucket: str | None = None
    model_cache_dir: Path = Path("/models")
    s3_endpoint_url: str | None = None
    aws_region: str | None = None


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bucket", help="S3 bucket of the models (env LLMFLEET_MODEL_BUCKET)")
    parser.add_argument("--model", required=True, help="model name, e.g. llama-3.1-8b-instruct")
    parser.add_argument("--revision", required=True, help="model revision (S3 prefix below the name)")
    parser.add_argument(
        "--dest", type=Path, help="cache root (env LLMFLEET_MODEL_CACHE_DIR, default /models)"
    )
    parser.add_argument("--endpoint-url", help="S3 endpoint override (env LLMFLEET_S3_ENDPOINT_URL)")


def _log(msg: str, **fields: object) -> None:
    record = {"time": datetime.now(UTC).isoformat(), "level": "info", "msg": msg, **fields}
    print(json.dumps(record, default=str), file=sys.stdout, flush=True)


def run(args: argparse.Namespace) -> int:
    settings = ModelSyncSettings()
    bucket = args.bucket or settings.model_bucket
    if not bucket:
        raise ModelSyncError("no bucket: pass --bucket or set LLMFLEET_MODEL_BUCKET", param="bucket")
    dest: Path = args.dest or settings.model_cache_dir
    try:  # the `modelsync` extra: only the model-sync image carries boto3
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        raise ModelSyncError(MISSING_EXTRA) from None
    client = boto3.client(
        "s3", endpoint_url=args.endpoint_url or settings.s3_endpoint_url, region_name=settings.aws_region
    )
    started = time.monotonic()
    try:
        result = sync_model(Boto3ObjectStore(client), bucket, args.model, args.revision, dest)
    except (BotoCoreError, ClientError) as exc:
        raise ModelSyncError(f"s3://{bucket}/{args.model}/{args.revision}/: {exc}") from None
    except OSError as exc:
        raise ModelSyncError(f"{dest}: {exc}") from None
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
