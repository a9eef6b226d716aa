"""Images: one list of build inputs feeds the Docker build context and the image tag (issue 26 item 2).

ECR repositories are IMMUTABLE: a rebuild that pushes an existing tag is refused. So the tag
must change exactly when the image's content does: a file outside the build context (a commit's
`.git`, `Pulumi.<stack>.yaml`, docs, `.venv`, model weights) changes neither the context nor the
tag; a file the image COPYs (constraints.txt included) changes its tag.
"""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from infra.components.artifacts import (
    BUILD_CONTEXT,
    IMAGES,
    BuildInputError,
    content_tag,
    context_files,
    dockerignore_text,
    image_inputs,
)

ROOT = Path(__file__).resolve().parents[2]
PYTHON_IMAGES = [a for a in IMAGES if a != "vllm"]


def _matches(pattern: str, path: str) -> bool:
    """Go's filepath.Match per path segment (`*` stops at `/`); a leading `**/` is any depth."""
    if pattern.startswith("**/"):
        return any(_matches(pattern[3:], "/".join(path.split("/")[i:])) for i in range(path.count("/") + 1))
    want, have = pattern.split("/"), path.split("/")
    return len(want) == len(have) and all(fnmatch.fnmatchcase(h, w) for h, w in zip(have, want, strict=True))


def _dockerignore_admits(patterns: list[str], rel: str) -> bool:
    """Docker's .dockerignore rule: the last pattern matching the path or one of its parent
    directories decides; `!` re-includes."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    admitted = True
    for raw in patterns:
        pattern = raw.removeprefix("!")
        if any(_matches(pattern, prefix) for prefix in prefixes):
            admitted = raw.startswith("!")
    return admitted


def _patterns(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]


def test_the_dockerignore_is_generated_from_the_build_context_list() -> None:
    assert (ROOT / ".dockerignore").read_text(encoding="utf-8") == dockerignore_text()
    # pulumi-docker-build (and Docker) would prefer a Dockerfile-specific ignore file over it.
    assert not list((ROOT / "docker").glob("*.dockerignore"))


def test_the_context_docker_sends_is_exactly_the_listed_files() -> None:
    tracked = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True
    ).stdout.split()
    patterns = _patterns(dockerignore_text())
    sent = {f for f in tracked if _dockerignore_admits(patterns, f)}
    listed = {p.relative_to(ROOT).as_posix() for p in context_files(BUILD_CONTEXT)}
    assert sent == listed & set(tracked)
    for outside in ("Pulumi.prod.yaml", "docs/deploy.md", "docker/gateway.Dockerfile", "infra/program.py"):
        assert outside in tracked, outside
        assert outside not in sent, outside
    # Caches and what is never tracked stay out too.
    for junk in (".git/HEAD", ".venv/bin/python", "models/x/model.safetensors", "apps/__pycache__/a.pyc"):
        assert not _dockerignore_admits(patterns, junk), junk


def test_every_image_copies_only_listed_inputs_and_the_list_has_no_surplus() -> None:
    used: set[str] = set()
    for app in IMAGES:
        used |= set(image_inputs(app))
    assert used == set(BUILD_CONTEXT)
    for app in PYTHON_IMAGES:
        assert "constraints.txt" in image_inputs(app), app


def test_a_dockerfile_copying_a_path_outside_the_list_fails_the_render(tmp_path: Path) -> None:
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "x.Dockerfile").write_text("FROM a\nCOPY infra ./infra\n", encoding="utf-8")
    with pytest.raises(BuildInputError, match=r"docker/x\.Dockerfile copies infra"):
        image_inputs("x", tmp_path)


def _copy_tree(into: Path) -> None:
    for top in [*BUILD_CONTEXT, "docker", "docs", "Pulumi.prod.yaml"]:
        src = ROOT / top
        if src.is_dir():
            shutil.copytree(src, into / top, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, into / top)


def test_a_change_outside_the_context_keeps_every_tag_one_inside_retags(tmp_path: Path) -> None:
    _copy_tree(tmp_path)
    before = {app: content_tag(app, tmp_path) for app in IMAGES}
    assert before == {app: content_tag(app, ROOT) for app in IMAGES}
    assert all(re.fullmatch(r"c-[0-9a-f]{12}", t) for t in before.values())
    # Outside: `pulumi config set` rewriting the stack file, docs, git metadata, a venv, weights.
    (tmp_path / "Pulumi.prod.yaml").write_text("config: {}\n", encoding="utf-8")
    (tmp_path / "docs" / "deploy.md").write_text("changed\n", encoding="utf-8")
    for junk in (".git/HEAD", ".venv/bin/python", "models/m/r/model.safetensors", "apps/__pycache__/x.pyc"):
        (tmp_path / junk).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / junk).write_bytes(b"x")
    assert {app: content_tag(app, tmp_path) for app in IMAGES} == before
    # Inside: constraints.txt is copied into every Python image.
    with (tmp_path / "constraints.txt").open("a", encoding="utf-8") as f:
        f.write("# changed\n")
    after = {app: content_tag(app, tmp_path) for app in IMAGES}
    assert all(after[app] != before[app] for app in PYTHON_IMAGES), after
    assert after["vllm"] == before["vllm"]  # it copies nothing
    # A mode change is a change of the image (COPY keeps it, pulumi-docker-build hashes it).
    script = tmp_path / "apps" / "cli" / "main.py"
    script.chmod(script.stat().st_mode | 0o111)
    moded = {app: content_tag(app, tmp_path) for app in IMAGES}
    assert all(moded[app] != after[app] for app in PYTHON_IMAGES), moded
    after = moded
    # A Dockerfile edit retags that image only.
    with (tmp_path / "docker" / "vllm.Dockerfile").open("a", encoding="utf-8") as f:
        f.write("# changed\n")
    again = {app: content_tag(app, tmp_path) for app in IMAGES}
    assert again["vllm"] != after["vllm"]
    assert {a: again[a] for a in PYTHON_IMAGES} == {a: after[a] for a in PYTHON_IMAGES}
