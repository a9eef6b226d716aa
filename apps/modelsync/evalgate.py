"""The evaluation gate (issue 30 item 2): a revision's signed evaluation result next to its manifest,
and the check `llmfleet model canary` (a weight above 0) and `promote` run before a revision takes
production traffic.

`s3://<bucket>/<model>/<revision>/llmfleet-eval.json` holds the latest evaluation of the revision,
signed like the manifest (KMS in the stacks, a local key in dev; `signing.py`) and bound to it (the
manifest's SHA-256): a result copied from another revision, edited, or signed with another key is
refused, as is a revision with no result or a failed one. A later evaluation replaces an earlier
one (the revision's files never change; the suite or the SLO may). Model-sync never downloads it
(`manifest.OURS`).
"""

from __future__ import annotations

from typing import Any, Protocol

from apps.modelsync.manifest import EVAL_NAME, ManifestError
from apps.modelsync.signing import Signer, Verifier, seal_document, unseal_document
from apps.modelsync.sync import ModelSyncError, ObjectStore, safe_component, verified_manifest

FORMAT = "llmfleet-model-eval/1"
FIELD = "evaluation"


class EvalStore(ObjectStore, Protocol):
    def put_bytes(self, bucket: str, key: str, data: bytes, *, if_absent: bool = False) -> bool: ...


class NotEvaluated(ModelSyncError):
    code = "revision_not_evaluated"


class EvaluationFailed(ModelSyncError):
    code = "revision_failed_evaluation"


def prefix_of(model: str, revision: str) -> str:
    return f"{safe_component(model, 'model')}/{safe_component(revision, 'revision')}/"


def manifest_sha256(store: ObjectStore, verifier: Verifier, bucket: str, model: str, revision: str) -> str:
    """The SHA-256 of the revision's manifest object, once it verifies (a revision must be published,
    `llmfleet model publish`, before it is evaluated or gated)."""
    _, sha = verified_manifest(store, verifier, bucket, prefix_of(model, revision), model, revision)
    return sha


def write_result(
    store: EvalStore, signer: Signer, bucket: str, model: str, revision: str, document: dict[str, Any]
) -> str:
    """Sign `document` (the evaluation, `evalsuite.verdict` plus what it names) and put it next to
    the manifest; returns its URL."""
    body = {"format": FORMAT, "model": model, "revision": revision, **document}
    key = prefix_of(model, revision) + EVAL_NAME
    store.put_bytes(bucket, key, seal_document(FIELD, body, signer))
    return f"s3://{bucket}/{key}"


def require_passing(
    store: ObjectStore, verifier: Verifier, bucket: str, model: str, revision: str
) -> dict[str, Any]:
    """The revision's evaluation when it verifies and passed; else one clear error."""
    where = f"s3://{bucket}/{prefix_of(model, revision)}{EVAL_NAME}"
    manifest = manifest_sha256(store, verifier, bucket, model, revision)
    raw = store.get_bytes(bucket, prefix_of(model, revision) + EVAL_NAME)
    if raw is None:
        raise NotEvaluated(
            f"{model} revision {revision} has no evaluation: run `llmfleet model eval` on it first",
            param="revision",
        )
    body = unseal_document(FIELD, raw, verifier, where)
    named = (body.get("format"), body.get("model"), body.get("revision"), body.get("manifest_sha256"))
    if named != (FORMAT, model, revision, manifest):
        raise ManifestError(f"{where}: the evaluation is not of this revision's manifest")
    if body.get("passed") is not True:
        raise EvaluationFailed(f"{model} revision {revision} failed its evaluation: {summary(body)}")
    return body


def summary(body: dict[str, Any]) -> str:
    """One line: what passed and what did not (never content)."""
    cases = body.get("cases") or []
    failed = [c.get("name") for c in cases if isinstance(c, dict) and not c.get("passed")]
    line = f"{body.get('pass_ratio')} of cases passed (needs {body.get('min_pass_ratio')})"
    if failed:
        line += f", failed: {', '.join(str(n) for n in failed[:5])}" + (" ..." if len(failed) > 5 else "")
    line += f"; TTFT p95 {body.get('ttft_p95_s')} s (SLO {body.get('slo_ttft_p95_s')} s)"
    return line
