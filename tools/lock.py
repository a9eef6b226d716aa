"""The constraints file (`constraints.txt`): every package version `make install`, CI and the images install.

    python3.11 tools/lock.py write   # `make lock`: resolve pyproject.toml with uv, then stamp it
    python3.11 tools/lock.py check   # `make lock-check`: fail when pyproject.toml changed since the lock

`write` keeps every version already pinned in constraints.txt that still satisfies pyproject.toml (uv reads
the existing file as its preferences), so adding a dependency pins only what it brings. The stamp is a
SHA-256 of pyproject.toml's dependency tables (dependencies, optional-dependencies, requires-python), so
`check` needs neither the network nor uv. Standard library only: it runs before the venv exists.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK_NAME = "constraints.txt"
STAMP_PREFIX = "# pyproject.toml dependencies sha256: "
PYTHON_VERSION = "3.11"  # the images' and CI's Python; markers keep other platforms resolvable


def deps_digest(pyproject: Path) -> str:
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    tables = {
        "dependencies": project.get("dependencies", []),
        "optional-dependencies": project.get("optional-dependencies", {}),
        "requires-python": project.get("requires-python", ""),
    }
    return hashlib.sha256(json.dumps(tables, sort_keys=True).encode()).hexdigest()


def stamped(lock_text: str, digest: str) -> str:
    lines = [line for line in lock_text.splitlines() if not line.startswith(STAMP_PREFIX)]
    header = 0
    while header < len(lines) and lines[header].startswith("#"):
        header += 1
    lines.insert(header, STAMP_PREFIX + digest)
    return "\n".join(lines) + "\n"


def read_stamp(lock_text: str) -> str | None:
    for line in lock_text.splitlines():
        if line.startswith(STAMP_PREFIX):
            return line.removeprefix(STAMP_PREFIX).strip()
    return None


def check(root: Path) -> str | None:
    """None when the lock is current, else the one-line reason."""
    lock = root / LOCK_NAME
    if not lock.exists():
        return f"{LOCK_NAME} is missing: run `make lock` and commit it"
    stamp = read_stamp(lock.read_text(encoding="utf-8"))
    if stamp is None:
        return f"{LOCK_NAME} has no '{STAMP_PREFIX.strip()}' line: run `make lock` and commit it"
    if stamp != deps_digest(root / "pyproject.toml"):
        return (
            f"{LOCK_NAME} is stale: pyproject.toml's dependencies changed since it was generated; "
            f"run `make lock` and commit {LOCK_NAME}"
        )
    return None


def write(root: Path, uv: str) -> None:
    lock = root / LOCK_NAME
    command = [
        uv, "pip", "compile", "pyproject.toml", "--all-extras", "--universal",
        "--python-version", PYTHON_VERSION, "--no-config", "--quiet",
        "--custom-compile-command", "make lock", "--output-file", LOCK_NAME,
    ]  # fmt: skip
    subprocess.run(command, cwd=root, check=True)
    lock.write_text(stamped(lock.read_text(encoding="utf-8"), deps_digest(root / "pyproject.toml")))


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "write":
        write(ROOT, argv[1])
        return 0
    if argv == ["check"]:
        problem = check(ROOT)
        if problem is not None:
            print(f"lock-check: {problem}", file=sys.stderr)
            return 1
        print(f"lock-check: {LOCK_NAME} matches pyproject.toml")
        return 0
    print("usage: tools/lock.py write UV_BINARY | check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
