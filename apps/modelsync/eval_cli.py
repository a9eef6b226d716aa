"""`llmfleet model eval`: run a golden set on a published revision and sign the result; and the gate
`canary` (a weight above 0) and `promote` run (`evalgate.require_passing`).

    llmfleet model eval --model M --revision R --suite FILE --stack S --bucket B
        (--kms-key-id KEY | --signing-key FILE) [--base-url URL] [--api-key JWT]

The revision must be published (its manifest verifies) and served by a node that takes no production
traffic (a canary at weight 0: `llmfleet model canary --weight 0`, or the stack's `canary` section).
The golden set runs through the gateway (`evalrun.py`) with an admin JWT; the result is graded
(`evalsuite.py`) against the cases and the stack's `slo.ttft_p95_s`, signed and written next to the
manifest. Exit 0: passed; 1: failed (the result is written: the gate refuses the revision); 2: the
evaluation could not run (one line).
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from apps.core.envnames import env_name
from apps.modelsync.evalgate import manifest_sha256, require_passing, write_result
from apps.modelsync.evalrun import run_suite
from apps.modelsync.evalsuite import load_suite, verdict
from apps.modelsync.settings import ModelSyncSettings
from apps.modelsync.signing import KmsVerifier, LocalVerifier, Verifier, public_key_path
from apps.modelsync.sync import ModelSyncError


def store_options(parser: argparse.ArgumentParser) -> None:
    """Where the registry is and the key its signatures are checked with (eval and the gate)."""
    env = ModelSyncSettings
    parser.add_argument("--bucket", help=f"S3 bucket of the models (env {env_name(env, 'model_bucket')})")
    parser.add_argument(
        "--endpoint-url", help=f"S3 endpoint override (env {env_name(env, 's3_endpoint_url')})"
    )
    parser.add_argument(
        "--verify-key",
        type=Path,
        help=f"a local public key (dev; env {env_name(env, 'model_verify_key')}); else the KMS key "
        f"({env_name(env, 'model_signing_key')})",
    )


def configure(actions: Any) -> None:
    env = ModelSyncSettings
    ev = actions.add_parser(
        "eval",
        help="run a golden set on a revision and sign the result; only a passing revision is promoted",
    )
    ev.add_argument("--model", required=True, help="model name, e.g. llama-3.1-8b-instruct")
    ev.add_argument("--revision", required=True, help="the published revision to evaluate")
    ev.add_argument("--suite", type=Path, required=True, help="the golden set (YAML or JSON)")
    ev.add_argument("--stack", required=True, help="the stack whose SLO the latency is checked against")
    ev.add_argument("--base-url", help=f"the gateway's /v1 URL (env {env_name(env, 'gateway_url')})")
    ev.add_argument("--api-key", help=f"an admin JWT (env {env_name(env, 'eval_api_key')})")
    ev.add_argument("--timeout", type=float, default=120.0, help="seconds per case (default 120)")
    ev.add_argument("--actor", default=getpass.getuser(), help="who the result names (default: you)")
    key = ev.add_mutually_exclusive_group()
    key.add_argument(
        "--kms-key-id", help=f"the KMS key that signs (env {env_name(env, 'model_signing_key')})"
    )
    key.add_argument("--signing-key", type=Path, help="a local ECDSA P-256 key file (dev)")
    store_options(ev)


def verifier_for(args: argparse.Namespace, settings: ModelSyncSettings) -> Verifier:
    from apps.modelsync.cli import verifier_of

    if getattr(args, "verify_key", None) is not None:
        return LocalVerifier.load(args.verify_key)
    if getattr(args, "signing_key", None) is not None:  # dev: the local key's public half
        return LocalVerifier.load(public_key_path(args.signing_key))
    if getattr(args, "kms_key_id", None):  # the key that signs verifies too (`kms:Verify`)
        import boto3

        return KmsVerifier(boto3.client("kms", region_name=settings.aws_region), args.kms_key_id)
    return verifier_of(settings)


def gate(args: argparse.Namespace, model: str, revision: str) -> None:
    """Refuse a revision without a verified, passing evaluation (`canary` above 0, `promote`)."""
    from apps.modelsync.cli import bucket_of, one_line_errors, store_of

    settings = ModelSyncSettings()
    bucket = bucket_of(args, settings)
    store = store_of(args, settings)
    with one_line_errors(f"s3://{bucket}/{model}/{revision}/", Path(".")):
        require_passing(store, verifier_for(args, settings), bucket, model, revision)


def run(args: argparse.Namespace) -> int:
    from apps.core.spec import load_spec
    from apps.modelsync.cli import bucket_of, one_line_errors, store_of
    from apps.modelsync.model_cli import signer_of

    settings = ModelSyncSettings()
    suite, suite_sha = load_suite(args.suite)
    spec = load_spec(args.stack)
    if args.model not in spec.models:
        raise ModelSyncError(f"model {args.model!r} is not in stack {spec.name}", param="model")
    base_url = args.base_url or settings.gateway_url
    api_key = args.api_key or (settings.eval_api_key.get_secret_value() if settings.eval_api_key else "")
    if not base_url or not api_key:
        names = env_name(ModelSyncSettings, "gateway_url"), env_name(ModelSyncSettings, "eval_api_key")
        raise ModelSyncError(f"the gateway and an admin JWT: --base-url/{names[0]}, --api-key/{names[1]}")
    bucket, store = bucket_of(args, settings), store_of(args, settings)
    signer = signer_of(args, settings)
    where = f"s3://{bucket}/{args.model}/{args.revision}/"
    with one_line_errors(where, args.suite):
        manifest = manifest_sha256(store, verifier_for(args, settings), bucket, args.model, args.revision)
    answers = asyncio.run(
        run_suite(
            suite,
            base_url=base_url,
            api_key=api_key,
            model=args.model,
            revision=args.revision,
            timeout_s=args.timeout,
        )
    )
    outcome = verdict(suite, answers, args.revision, spec.slo.ttft_p95_s)
    document = {
        "manifest_sha256": manifest,
        "suite": {"name": suite.name, "sha256": suite_sha, "cases": len(suite.cases)},
        "stack": spec.name,
        "evaluated_at": datetime.now(UTC).isoformat(),
        "evaluated_by": args.actor,
        "signed_by": signer.key_id,
        **outcome,
    }
    with one_line_errors(where, args.suite):
        url = write_result(store, signer, bucket, args.model, args.revision, document)
    failed = [c["name"] for c in outcome["cases"] if not c["passed"]]
    record = {
        "msg": "model evaluated",
        "model": args.model,
        "revision": args.revision,
        "passed": outcome["passed"],
        "pass_ratio": outcome["pass_ratio"],
        "ttft_p95_s": outcome["ttft_p95_s"],
        "failed_cases": failed,
        "url": url,
    }
    print(json.dumps(record), flush=True)
    return 0 if outcome["passed"] else 1
