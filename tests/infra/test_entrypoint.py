"""`infra/__main__.py` (what `pulumi up` runs) reads the stack's Pulumi config and builds the program."""

from __future__ import annotations

import runpy
import warnings
from pathlib import Path

import pulumi
from pulumi.runtime.config import set_all_config
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from infra.render import Mocks

MAIN = Path(__file__).resolve().parents[2] / "infra" / "__main__.py"


def _run_main() -> None:
    runpy.run_path(str(MAIN), run_name="__main__")


def test_main_builds_the_stack_named_in_pulumi_config() -> None:
    mocks = Mocks()
    pulumi.runtime.set_mocks(mocks, project="llmfleet", stack="anything", preview=False)
    set_all_config({"llmfleet:stack": "prod", "llmfleet:scaleModels": "true", "aws:region": "us-east-1"})
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"pulumi_(aws|eks)(\.|$)")
            _sync_await(run_pulumi_func(_run_main))
    finally:
        set_all_config({})
    names = {(r["type"], r["name"]) for r in mocks.resources}
    assert ("eks:index:Cluster", "inference") in names
    deployments = {
        r["inputs"]["metadata"]["name"]: r["inputs"]
        for r in mocks.resources
        if r["type"] == "kubernetes:apps/v1:Deployment"
    }
    assert len(deployments) == 6  # 8B floor + spot burst, 32B, 70B, gateway, orchestrator
    # prod's 8B floor is 2 on-demand replicas (dev's is 1), once scaleModels is on: the config's
    # stack and settings were honoured
    assert deployments["vllm-llama-3-1-8b-instruct"]["spec"]["replicas"] == 2
