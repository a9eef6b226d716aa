"""Dockerfiles: slim, non-root, entry point a real console command; `llmfleet infra render` CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from apps.cli.main import COMMANDS, main

ROOT = Path(__file__).resolve().parents[2]
APPS = ("gateway", "orchestrator", "agent", "modelsync")  # ours; docker/vllm.Dockerfile mirrors upstream
COMMAND_OF = {"modelsync": "model-sync"}


def _entry(text: str) -> list[str]:
    entry = json.loads(re.search(r"^ENTRYPOINT (.+)$", text, re.M).group(1))  # type: ignore[union-attr]
    cmd = json.loads(re.search(r"^CMD (.+)$", text, re.M).group(1))  # type: ignore[union-attr]
    return [*entry, *cmd]


@pytest.mark.parametrize("app", APPS)
def test_dockerfile_entry_point_is_a_real_console_command(app: str) -> None:
    text = (ROOT / "docker" / f"{app}.Dockerfile").read_text(encoding="utf-8")
    argv = _entry(text)
    assert argv[0] == "llmfleet"
    assert argv[1] == COMMAND_OF.get(app, app)
    assert argv[1] in COMMANDS
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'llmfleet = "apps.cli.main:main"' in pyproject
    final_stage = text.split("\nFROM ")[-1]
    assert final_stage.startswith("python:3.11-slim")
    user = re.findall(r"^USER (\S+)$", final_stage, re.M)
    assert user
    assert not user[-1].startswith(("0", "root"))


def test_model_sync_has_its_own_image_and_the_init_containers_use_it() -> None:
    from tests.infra.conftest import kube_objects

    assert COMMANDS["model-sync"][0] == "apps.modelsync.cli"
    assert "COPY apps ./apps" in (ROOT / "docker" / "modelsync.Dockerfile").read_text(encoding="utf-8")
    inits = [
        c for d in kube_objects("prod") if d["kind"] == "Deployment"
        for c in d["spec"]["template"]["spec"].get("initContainers", [])
    ]  # fmt: skip
    assert inits
    assert {c["name"] for c in inits} == {"model-sync"}
    assert all("modelsync" in c["image"] and "agent" not in c["image"] for c in inits), {
        c["image"] for c in inits
    }


def test_infra_render_cli_prints_sorted_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["infra", "render", "--stack", "dev"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows
    assert all(set(r) == {"type", "name", "inputs", "parent", "dependsOn"} for r in rows)
    keys = [(r["type"], r["name"]) for r in rows]
    assert keys == sorted(keys)


def test_infra_render_unknown_stack_is_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["infra", "render", "--stack", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert "nope" in err
    assert "\n" not in err


def _our_containers(stack: str) -> list[dict[str, object]]:
    from tests.infra.conftest import kube_objects

    out: list[dict[str, object]] = []
    for dep in kube_objects(stack):
        if dep["kind"] not in ("Deployment", "Job"):
            continue
        pod = dep["spec"]["template"]["spec"]
        out += [c for c in [*pod.get("initContainers", []), *pod["containers"]] if c["name"] != "vllm"]
    return out


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_container_args_parse_with_the_real_subcommands(stack: str) -> None:
    """The pods call `llmfleet <command> ...`: every rendered command line must parse."""
    import argparse
    import importlib

    seen = set()
    for container in _our_containers(stack):
        argv = [str(a).replace("$(POD_NAME)", "pod-0") for a in container["args"]]  # type: ignore[attr-defined]
        module = importlib.import_module(COMMANDS[argv[0]][0])
        parser = argparse.ArgumentParser(prog=f"llmfleet {argv[0]}")
        module.configure(parser)
        parser.parse_args(argv[1:])  # exits (SystemExit) on an unknown or missing option
        seen.add(argv[0])
    assert seen == {"gateway", "orchestrator", "agent", "model-sync", "admin"}
