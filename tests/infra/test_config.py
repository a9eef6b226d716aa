"""Stack settings: Pulumi.<stack>.yaml parsing and the GPU limit against the plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.core.sizing.plan import plan_fleet
from apps.core.spec import load_spec
from infra.config import InfraConfig
from infra.manifests.karpenter import gpu_pool_spec
from infra.render import config_for


def test_from_mapping_parses_strings_and_keeps_defaults() -> None:
    cfg = InfraConfig.from_mapping(
        "prod", {"gpuLimit": "12", "availabilityZones": "eu-west-1a, eu-west-1b", "singleNatGateway": "false"}
    )
    assert cfg.gpu_limit == 12
    assert cfg.availability_zones == ("eu-west-1a", "eu-west-1b")
    assert cfg.single_nat_gateway is False
    assert cfg.system_instance_type == InfraConfig(stack="x").system_instance_type


def test_pulumi_stack_files_are_read(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.demo.yaml").write_text(
        "config:\n  aws:region: eu-central-1\n  llmfleet:stack: dev\n  llmfleet:gpuLimit: '8'\n",
        encoding="utf-8",
    )
    cfg = config_for("demo", tmp_path)
    assert (cfg.stack, cfg.region, cfg.gpu_limit) == ("dev", "eu-central-1", 8)
    assert config_for("missing", tmp_path) == InfraConfig(stack="missing")


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_gpu_limit_admits_every_replica_and_prod_peak(stack: str) -> None:
    cfg = config_for(stack)
    plan = plan_fleet(load_spec(cfg.stack))
    assert cfg.gpu_limit >= max(m.gpus_per_replica for m in plan.models.values())
    if stack == "prod":
        assert cfg.gpu_limit == 16  # the brief: a runaway scale-up cannot buy more
        assert plan.gpus_cloud <= cfg.gpu_limit


def test_pool_spec_comes_from_the_spec() -> None:
    pools = gpu_pool_spec(load_spec("prod"), 16)
    assert pools.instance_family == "g6e"
    assert pools.gpus_per_instance == (1, 4, 8)
    assert pools.spot_model == "llama-3.1-8b-instruct"
