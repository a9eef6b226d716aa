"""`llmfleet model-sync`: the init container of every vLLM pod on EKS.

`llmfleet model-sync --bucket B --model M --revision R` copies `s3://<bucket>/<model>/<revision>/`
to `<dest>/<model>/<revision>` (hostPath on the node's NVMe) and exits 0, once the revision's
signed manifest verifies with the configured key (`LLMFLEET_MODEL_SIGNING_KEY`: the KMS key;
`LLMFLEET_MODEL_VERIFY_KEY`: a local public key in dev) and every file matches it; a second pod
on the same node finds the completion marker and starts in seconds. A revision is published with
`llmfleet model publish` (apps/modelsync/model_cli.py). Errors are one line and exit 2 (via
`LlmfleetError`): an unsigned or tampered revision never starts a pod.
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
from apps.modelsync.signing import KmsVerifier, LocalVerifier, Verifier
from apps.modelsync.sync import ModelSyncError, sync_model

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
    parser.add_argument("--model", help="model name, e.g. llama-3.1-8b-instruct (required)")
    parser.add_argument("--revision", help="model revision (S3 prefix below the name; required)")
    parser.add_argument(
        "--dest",
        type=Path,
        help=f"cache root (env {env_name(ModelSyncSettings, 'model_cache_dir')}, default /models)",
    )


def _log(msg: str, **fields: object) -> None:
    record = {"time": datetime.now(UTC).isoformat(), "level": "info", "msg": msg, **fields}
    print(json.dumps(record, default=str), file=sys.stdout, flush=True)


def store_of(args: argparse.Namespace, settings: ModelSyncSettings) -> Boto3ObjectStore:
    try:  # the `modelsync` extra: only the model-sync image carries boto3
        import boto3

        from apps.modelsync.s3 import Boto3ObjectStore
    except ImportError:
        raise ModelSyncError(MISSING_EXTRA) from None
    client = boto3.client(
        "s3", endpoint_url=args.endpoint_url or settings.s3_endpoint_url, region_name=settings.aws_region
    )
    return Boto3ObjectStore(client)


def bucket_of(args: argparse.Namespace, settings: ModelSyncSettings) -> str:
    bucket = args.bucket or settings.model_bucket
    if not bucket:
        name = env_name(ModelSyncSettings, "model_bucket")
        raise ModelSyncError(f"no bucket: pass --bucket or set {name}", param="bucket")
    return str(bucket)


def verifier_of(settings: ModelSyncSettings) -> Verifier:
    """The key manifests are checked with: a local public key (dev) or the KMS key (`kms:Verify`)."""
    if settings.model_verify_key is not None:
        return LocalVerifier.load(settings.model_verify_key)
    if settings.model_signing_key:
        import boto3  # present whenever `store_of` succeeded

        return KmsVerifier(boto3.client("kms", region_name=settings.aws_region), settings.model_signing_key)
    kms, local = (
        env_name(ModelSyncSettings, "model_signing_key"),
        env_name(ModelSyncSettings, "model_verify_key"),
    )
    raise ModelSyncError(
        f"no key to verify the revision's manifest with: set {kms} (the KMS key) or {local} (a public key file)",
        param="key",
    )


@contextmanager
def one_line_errors(url: str, local: Path) -> Iterator[None]:
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
    if not args.model or not args.revision:
        raise ModelSyncError(
            "--model and --revision are required (to publish a revision: llmfleet model publish)",
            param="model",
        )
    bucket = bucket_of(args, settings)
    dest: Path = args.dest or settings.model_cache_dir
    store = store_of(args, settings)
    started = time.monotonic()
    with one_line_errors(f"s3://{bucket}/{args.model}/{args.revision}/", dest):
        verifier = verifier_of(settings)
        result = sync_model(store, verifier, bucket, args.model, args.revision, dest)
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
