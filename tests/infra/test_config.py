"""Stack settings: Pulumi.<stack>.yaml parsing and the GPU limit against the plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.core.sizing.plan import plan_fleet
from apps.core.sizing.pools import ON_DEMAND_POOL, SPOT_POOL
from apps.core.spec import load_spec
from infra.config import InfraConfig
from infra.manifests.karpenter import gpu_pool_spec
from infra.render import config_for


def test_from_mapping_parses_strings_and_keeps_defaults() -> None:
    cfg = InfraConfig.from_mapping(
        "prod",
        {"scaleModels": "true", "availabilityZones": "eu-west-1a, eu-west-1b", "singleNatGateway": "false"},
    )
    assert cfg.scale_models is True
    assert cfg.availability_zones == ("eu-west-1a", "eu-west-1b")
    assert cfg.single_nat_gateway is False
    assert cfg.system_instance_type == InfraConfig(stack="x").system_instance_type


def test_pulumi_stack_files_are_read(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.demo.yaml").write_text(
        "config:\n  aws:region: eu-central-1\n  llmfleet:stack: dev\n  llmfleet:scaleModels: 'true'\n",
        encoding="utf-8",
    )
    cfg = config_for("demo", tmp_path)
    assert (cfg.stack, cfg.region, cfg.scale_models) == ("dev", "eu-central-1", True)
    assert config_for("missing", tmp_path).stack == "missing"


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_pool_limits_admit_every_replica_maximum(stack: str) -> None:
    spec = load_spec(stack)
    plan = plan_fleet(spec)
    limits = gpu_pool_spec(spec).gpu_limits
    assert limits[ON_DEMAND_POOL] >= sum(m.max_replicas * m.gpus_per_replica for m in plan.models.values())
    if stack == "prod":
        # 8B 8 x 1, 32B 5 x TP2 on 4-GPU nodes (3 nodes), 70B 3 x 4, bge-m3 3 x 1; spot: the 8B burst of 6.
        assert limits == {ON_DEMAND_POOL: 8 + 12 + 12 + 3, SPOT_POOL: 6}


def test_pool_spec_comes_from_the_spec() -> None:
    pools = gpu_pool_spec(load_spec("prod"))
    assert pools.instance_family == "g6e"
    assert pools.gpus_per_instance == (1, 4, 8)
    assert pools.spot_model == "llama-3.1-8b-instruct"
