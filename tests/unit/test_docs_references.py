"""The repository stands alone: no file cites a document that a clone lacks.

Code and docs once cited design notes kept outside the repository (`../shared/...`, reference notes
by file name, "ARCHITECTURE D5"). The design record is `docs/architecture.md` and the engine facts
are in `docs/vllm-facts.md`; this test keeps every citation inside the repository.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED_DIRS = ("apps", "infra", "tools", "docs", "tests")
SCANNED_FILES = ("README.md", "CONTRIBUTING.md")
SELF = Path(__file__).resolve()

# Paths of the notes that lived next to the repository, never inside it.
OUTSIDE_PATHS = re.compile(r"\.\./shared|shared/reference|shared/spec|shared/crds")
# Names of those notes, cited without a path ("vllm-behaviour.md section 7", "kubernetes-facts §4").
NOTE_NAMES = (
    "vllm-behaviour",
    "real-vllm-on-cpu",
    "kubernetes-facts",
    "infra-apply-facts",
    "peer-pain-points",
    "peer-features",
    "local-tooling",
    "platform-design",
)
# The old name of the design record ("ARCHITECTURE D5"); case-sensitive, as it was written.
OLD_RECORD = re.compile(r"\bARCHITECTURE\b")
DOCS_PATH = re.compile(r"(?<![\w/.-])docs/[A-Za-z0-9_./-]+\.md")
MD_LINK = re.compile(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)")


def _tracked() -> list[Path]:
    """The files git tracks under the scanned roots (a tree without git: every file there)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--", *SCANNED_DIRS, *SCANNED_FILES],
            cwd=ROOT,
            capture_output=True,
            check=True,
            timeout=30,
        ).stdout
        paths = [ROOT / p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.SubprocessError):
        paths = [p for d in SCANNED_DIRS for p in (ROOT / d).rglob("*") if p.is_file()]
        paths += [ROOT / f for f in SCANNED_FILES]
    return [p for p in paths if p.is_file() and p.resolve() != SELF and "__pycache__" not in p.parts]


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data:  # binary (screenshots)
        return None
    return data.decode("utf-8", errors="replace")


def _note_exists(name: str, files: list[Path]) -> bool:
    return any(p.suffix == ".md" and p.name.startswith(name) for p in files)


def test_no_reference_points_outside_the_repository() -> None:
    files = _tracked()
    assert len(files) > 50, f"the scan found only {len(files)} files under {SCANNED_DIRS}"
    missing_notes = [n for n in NOTE_NAMES if not _note_exists(n, files)]
    note_re = re.compile("|".join(re.escape(n) for n in missing_notes)) if missing_notes else None
    found: list[str] = []
    for path in files:
        text = _text(path)
        if text is None:
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            hits = [m.group(0) for m in OUTSIDE_PATHS.finditer(line)]
            if note_re is not None:
                hits += [m.group(0) for m in note_re.finditer(line)]
            hits += [m.group(0) for m in OLD_RECORD.finditer(line)]
            for hit in hits:
                found.append(f"{path.relative_to(ROOT)}:{lineno}: {hit!r}")
    assert found == [], (
        "references to documents the repository lacks (cite docs/architecture.md, "
        "docs/vllm-facts.md or the upstream source instead):\n" + "\n".join(found)
    )


def test_every_docs_link_resolves() -> None:
    docs = sorted((ROOT / "docs").glob("*.md"))
    assert (ROOT / "docs" / "architecture.md") in docs
    broken: list[str] = []
    for path in [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *docs]:
        text = path.read_text(encoding="utf-8")
        for lineno, line in enumerate(text.splitlines(), 1):
            for target in DOCS_PATH.findall(line):
                if not (ROOT / target).is_file():
                    broken.append(f"{path.relative_to(ROOT)}:{lineno}: {target}")
            for target in MD_LINK.findall(line):
                if "://" in target:
                    continue
                if not (path.parent / target).is_file():
                    broken.append(f"{path.relative_to(ROOT)}:{lineno}: ({target})")
    assert broken == [], "links to missing docs:\n" + "\n".join(broken)


def test_contributing_starts_with_the_design_record() -> None:
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    first = next(line for line in text.splitlines() if line and not line.startswith("#"))
    assert "docs/architecture.md" in first
