"""`llmfleet model publish`: put a model revision into the registry, signed.

`llmfleet model publish --model M --revision R --from DIR [--stack S] --bucket B
(--kms-key-id KEY | --signing-key FILE)` uploads DIR to `s3://B/M/R/` (resumable) and then writes
the revision's signed manifest (`apps/modelsync/publish.py`). With `--stack`, the manifest records
the serving arguments that stack's plan gives the model, and R defaults to the revision the stack
names. `--signing-key` is a local ECDSA P-256 key
for dev, created (0600, with its public half at `FILE.pub`) when missing; the stacks sign with the
KMS key the Pulumi program creates. Errors are one line and exit 2 (via `LlmfleetError`).
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from apps.core.envnames import env_name
from apps.modelsync import eval_cli, rollout_cli
from apps.modelsync.publish import publish_model
from apps.modelsync.settings import ModelSyncSettings
from apps.modelsync.signing import KmsSigner, LocalSigner, Signer, public_key_path
from apps.modelsync.sync import ModelSyncError


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(
        dest="action", metavar="{publish,eval,canary,promote,rollback,status}", required=True
    )
    publish = actions.add_parser(
        "publish",
        help="upload a revision's files and its signed manifest; a published revision is never overwritten",
        description="Upload DIR to s3://<bucket>/<model>/<revision>/ and sign its manifest.",
    )
    publish.add_argument("--model", required=True, help="model name, e.g. llama-3.1-8b-instruct")
    publish.add_argument(
        "--revision", help="the new revision (an S3 prefix below the name; default: the one --stack names)"
    )
    publish.add_argument("--from", dest="source", type=Path, required=True, help="local weights directory")
    publish.add_argument("--stack", help="record the serving arguments this stack's plan gives the model")
    publish.add_argument(
        "--bucket", help=f"S3 bucket of the models (env {env_name(ModelSyncSettings, 'model_bucket')})"
    )
    publish.add_argument(
        "--endpoint-url", help=f"S3 endpoint override (env {env_name(ModelSyncSettings, 's3_endpoint_url')})"
    )
    key = publish.add_mutually_exclusive_group()
    key.add_argument(
        "--kms-key-id",
        help=f"the KMS key that signs (env {env_name(ModelSyncSettings, 'model_signing_key')})",
    )
    key.add_argument(
        "--signing-key", type=Path, help="a local ECDSA P-256 key file (dev; created when missing)"
    )
    eval_cli.configure(actions)
    rollout_cli.configure(actions)


def _from_stack(stack: str | None, model: str, revision: str | None) -> tuple[str, dict[str, Any]]:
    """The revision (given, or the one the stack names) and the serving arguments to record."""
    if stack is None:
        if not revision:
            raise ModelSyncError("--revision is required (or --stack, whose spec names it)", param="revision")
        return revision, {}
    from apps.core.sizing.plan import plan_fleet
    from apps.core.spec import load_spec

    spec = load_spec(stack)
    if model not in spec.models:
        known = ", ".join(sorted(spec.models))
        raise ModelSyncError(f"model {model!r} is not in stack {spec.name} (known: {known})", param="model")
    plan = plan_fleet(spec).models[model]
    serving = {
        "stack": spec.name,
        "max_model_len": plan.max_model_len,
        "max_num_seqs": plan.max_num_seqs,
        "tensor_parallel_size": plan.gpus_per_replica,
        "gpu_type": plan.gpu_type,
    }
    return revision or spec.models[model].revision, serving


def signer_of(args: argparse.Namespace, settings: ModelSyncSettings) -> Signer:
    if args.signing_key is not None:
        return LocalSigner.load_or_create(args.signing_key)
    key_id = args.kms_key_id or settings.model_signing_key
    if not key_id:
        name = env_name(ModelSyncSettings, "model_signing_key")
        raise ModelSyncError(
            f"no signing key: pass --kms-key-id (or set {name}) or --signing-key", param="key"
        )
    import boto3

    return KmsSigner(boto3.client("kms", region_name=settings.aws_region), key_id)


def run(args: argparse.Namespace) -> int:
    if args.action in rollout_cli.ACTIONS:
        return rollout_cli.run(args)
    if args.action == "eval":
        return eval_cli.run(args)
    from apps.modelsync.cli import bucket_of, one_line_errors, store_of

    settings = ModelSyncSettings()
    source: Path = args.source
    if not source.is_dir():
        raise ModelSyncError(f"--from {source}: no such directory", param="from")
    revision, serving = _from_stack(args.stack, args.model, args.revision)
    bucket = bucket_of(args, settings)
    store = store_of(args, settings)
    signer = signer_of(args, settings)
    started = time.monotonic()
    with one_line_errors(f"s3://{bucket}/{args.model}/{revision}/", source):
        result = publish_model(store, signer, bucket, args.model, revision, source, serving)
    record = {
        "time": datetime.now(UTC).isoformat(),
        "level": "info",
        "msg": "model published",
        "model": args.model,
        "revision": revision,
        "url": f"s3://{bucket}/{result.upload.prefix}",
        "files": result.upload.files,
        "uploaded": result.upload.uploaded,
        "skipped": result.upload.skipped,
        "bytes_uploaded": result.upload.bytes_uploaded,
        "signed_by": signer.key_id,
        # What model-sync verifies with: the local key's public half (dev), or the KMS key itself.
        "verify_key": str(public_key_path(args.signing_key)) if args.signing_key else signer.key_id,
        "seconds": round(time.monotonic() - started, 3),
    }
    print(json.dumps(record), flush=True)
    return 0
