"""`infra/__main__.py` (what `pulumi up` runs) reads the stack's Pulumi config and builds the program."""

from __future__ import annotations

import runpy
import warnings
from pathlib import Path

import pulumi
import pytest
import yaml
from pulumi.runtime.config import set_all_config
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from infra.config import InfraConfigError
from infra.render import Mocks

MAIN = Path(__file__).resolve().parents[2] / "infra" / "__main__.py"


CERT = "arn:aws:acm:us-east-1:123456789012:certificate/0b8e2f4a-1c3d-4e5f-8a9b-0c1d2e3f4a5b"


def _run_main() -> None:
    runpy.run_path(str(MAIN), run_name="__main__")


def _main_with(config: dict[str, str], stack: str = "anything") -> Mocks:
    mocks = Mocks()
    pulumi.runtime.set_mocks(mocks, project="llmfleet", stack=stack, preview=False)
    set_all_config(config)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"pulumi_(aws|eks)(\.|$)")
            _sync_await(run_pulumi_func(_run_main))
    finally:
        set_all_config({})
    return mocks


def test_main_builds_the_stack_named_in_pulumi_config() -> None:
    mocks = _main_with(
        {
            "llmfleet:stack": "prod",
            "llmfleet:scaleModels": "true",
            "llmfleet:certificateArn": CERT,
            "aws:region": "us-east-1",
        }
    )
    names = {(r["type"], r["name"]) for r in mocks.resources}
    assert ("eks:index:Cluster", "inference") in names
    # The physical cluster name carries the Pulumi stack's name (two stacks of one spec per account).
    (cluster,) = [r for r in mocks.resources if r["type"] == "eks:index:Cluster"]
    assert cluster["inputs"]["name"] == "inference-anything"
    deployments = {
        r["inputs"]["metadata"]["name"]: r["inputs"]
        for r in mocks.resources
        if r["type"] == "kubernetes:apps/v1:Deployment"
    }
    assert len(deployments) == 7  # 8B floor + spot burst, 32B, 70B, bge-m3, gateway, orchestrator
    # prod's 8B floor is 2 on-demand replicas (dev's is 1), once scaleModels is on: the config's
    # stack and settings were honoured
    assert deployments["vllm-llama-3-1-8b-instruct"]["spec"]["replicas"] == 2


@pytest.mark.parametrize(
    ("arn", "message"),
    [
        (None, r"'' is not an ACM certificate ARN"),
        ("arn:aws:acm:us-east-1:123456789012:certificate/replace-me-prod", "is not an ACM certificate ARN"),
        (CERT.replace("us-east-1", "eu-west-1"), "is in eu-west-1, the stack in us-east-1"),
    ],
)
def test_up_refuses_a_missing_placeholder_or_foreign_certificate_before_any_resource(
    arn: str | None, message: str
) -> None:
    config = {"llmfleet:stack": "dev", "aws:region": "us-east-1"}
    if arn is not None:
        config["llmfleet:certificateArn"] = arn
    with pytest.raises(InfraConfigError, match=message):
        _main_with(config)


def test_no_stack_file_commits_a_placeholder_certificate() -> None:
    for path in MAIN.parents[1].glob("Pulumi.*.yaml"):
        config = yaml.safe_load(path.read_text(encoding="utf-8")).get("config", {})
        assert "llmfleet:certificateArn" not in config, path.name  # set per deployment, never committed
