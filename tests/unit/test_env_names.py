"""Every `LLMFLEET_*` name in apps/, infra/ and docs/ is a setting some app reads, and only the
settings modules spell one in code.

Code outside `apps/<app>/settings.py` (infra included) gets a name from the class
(`env_name(Settings, "field")`), so a misspelt name is an error instead of a setting silently left
at its default. Docstrings, comments and docs may name a setting, but only one that exists (a
renamed setting leaves no stale mention).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from apps.cli.settings_registry import known_names

ROOT = Path(__file__).resolve().parents[2]
APPS = ROOT / "apps"
CODE_DIRS = (APPS, ROOT / "infra")
MENTION_DIRS = (APPS, ROOT / "infra", ROOT / "docs")
NAME = re.compile(r"LLMFLEET_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_])")  # not a prefix such as `LLMFLEET_ENGINESIM_`

# String literals (not docstrings) that must spell a name, and why.
ALLOWED_LITERALS = {
    # `llmfleet dev` prints the admin JWT as a shell assignment for the operator's curl examples;
    # no app reads it.
    ("apps/cli/platform_config.py", "LLMFLEET_ADMIN_TOKEN"),
    # apps.core may not import the apps' settings classes (import-linter): its messages name them.
    ("apps/core/embedded.py", "LLMFLEET_DATABASE_URL"),
    ("apps/core/embedded.py", "LLMFLEET_REDIS_URL"),
    ("apps/core/metrics_access.py", "LLMFLEET_METRICS_PORT"),
    ("apps/core/metrics_access.py", "LLMFLEET_METRICS_TOKEN"),
}
# Names mentioned that no settings class has, and why.
NOT_SETTINGS = {
    "LLMFLEET_ADMIN_TOKEN": "the credentials.env line `llmfleet dev` writes for the operator",
    "LLMFLEET_REQUIRE_REAL_VLLM": "the test harness's switch (tests/conformance/conftest.py, set by `make realvllm`)",
}


def _is_settings_module(path: Path) -> bool:
    return path.name == "settings.py" and path.parent.parent == APPS


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def literal_names(path: Path) -> set[str]:
    """The `LLMFLEET_*` names in the file's string literals, docstrings excepted."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _docstrings(tree)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            names.update(NAME.findall(node.value))
    return names


def test_only_settings_modules_spell_an_env_name_in_a_string() -> None:
    found = set()
    for path in sorted(p for d in CODE_DIRS for p in d.rglob("*.py")):
        if not _is_settings_module(path):
            rel = path.relative_to(ROOT).as_posix()
            found |= {(rel, name) for name in literal_names(path)}
    unexpected = sorted(found - ALLOWED_LITERALS)
    assert not unexpected, f"use env_name(Settings, 'field') instead of spelling these: {unexpected}"
    assert not ALLOWED_LITERALS - found, f"stale allow-list entries: {sorted(ALLOWED_LITERALS - found)}"


def test_the_check_sees_a_literal_but_not_a_docstring(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('"""Reads `LLMFLEET_DOC`."""\nX = f"set {1} LLMFLEET_PORTT"\nY = "LLMFLEET_HOST"\n')
    assert literal_names(sample) == {"LLMFLEET_PORTT", "LLMFLEET_HOST"}


def test_every_env_name_mentioned_in_apps_infra_and_docs_is_read_by_some_app() -> None:
    known = known_names() | set(NOT_SETTINGS)
    unknown = sorted(
        {
            (path.relative_to(ROOT).as_posix(), name)
            for path in (p for d in MENTION_DIRS for p in d.rglob("*"))
            if path.suffix in (".py", ".md")
            for name in NAME.findall(path.read_text(encoding="utf-8"))
            if name not in known
        }
    )
    assert not unknown, f"names no settings class has (a typo, or a renamed setting): {unknown}"
