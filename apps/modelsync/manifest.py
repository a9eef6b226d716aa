"""A model revision's signed manifest: what `llmfleet model publish` writes and `model-sync` checks.

`s3://<bucket>/<model>/<revision>/` holds the weights and one object of ours,
`llmfleet-manifest.json`: the manifest (every other file's path, size and SHA-256, the tokenizer's
files, the serving arguments the revision was published for) and its signature, ECDSA P-256 over
the manifest's canonical bytes (sorted keys, no whitespace) by AWS KMS in the stacks or a local key
in dev (`apps/modelsync/signing.py`). One object, so it is written in one step, last: a revision
with a manifest is published, and publishing never overwrites one. `model-sync` refuses a revision
without a valid signature, with an object the manifest does not list, or with a file whose size or
SHA-256 differs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from apps.core.errors import LlmfleetError

MANIFEST_NAME = "llmfleet-manifest.json"
EVAL_NAME = "llmfleet-eval.json"  # the revision's latest signed evaluation (apps/modelsync/evalgate.py)
OURS = frozenset({MANIFEST_NAME, EVAL_NAME})  # the platform's objects, not the model's files
FORMAT = "llmfleet-model-manifest/1"
# The files transformers and vLLM read the tokenizer from (a revision lists those it has).
TOKENIZER_FILES = frozenset(
    {
        "tokenizer.json",
        "tokenizer_config.json",
        "tokenizer.model",
        "special_tokens_map.json",
        "added_tokens.json",
        "vocab.json",
        "merges.txt",
        "generation_config.json",
        "chat_template.jinja",
    }
)


class ManifestError(LlmfleetError):
    """A revision's manifest is missing, unsigned, tampered with, or does not match its files."""

    code = "model_manifest_invalid"


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: str = FORMAT
    model: str
    revision: str
    created_at: str
    files: tuple[FileEntry, ...]
    tokenizer: tuple[str, ...]  # the paths (in `files`) the tokenizer is read from
    serving: dict[str, Any]  # the serving arguments it was published for (the stack's plan)
    signing: dict[str, str]  # key id and algorithm, for the reader; the signature is what counts

    def to_bytes(self) -> bytes:
        """The signed bytes."""
        return canonical(self.model_dump(mode="json"))

    @classmethod
    def parse(cls, data: Any, where: str) -> Manifest:
        try:
            manifest = cls.model_validate(data)
        except ValidationError as exc:
            raise ManifestError(f"{where}: not a valid manifest ({exc.error_count()} error(s))") from None
        if manifest.format != FORMAT:
            raise ManifestError(f"{where}: unknown manifest format {manifest.format!r} (this reads {FORMAT})")
        return manifest

    def by_path(self) -> dict[str, FileEntry]:
        return {entry.path: entry for entry in self.files}


def canonical(data: Any) -> bytes:
    """Sorted keys, no whitespace: the same document always gives the same bytes (and a JSON
    document read back gives the bytes it was written from)."""
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def build_manifest(
    model: str,
    revision: str,
    files: Sequence[tuple[PurePosixPath, int, str]],
    serving: dict[str, Any],
    signing: dict[str, str],
    now: datetime | None = None,
) -> Manifest:
    """`files`: (relative path, size, SHA-256) of every file of the revision."""
    entries = tuple(FileEntry(path=str(rel), size=size, sha256=sha) for rel, size, sha in sorted(files))
    clashing = sorted(e.path for e in entries if e.path in OURS)
    if clashing:
        raise ManifestError(
            f"{', '.join(clashing)}: a file of the revision may not use this name", param="from"
        )
    tokenizer = tuple(e.path for e in entries if PurePosixPath(e.path).name in TOKENIZER_FILES)
    return Manifest(
        model=model,
        revision=revision,
        created_at=(now or datetime.now(UTC)).isoformat(),
        files=entries,
        tokenizer=tokenizer,
        serving=serving,
        signing=signing,
    )
