"""The planner checks the pools (issue 13 item 9/D) and image tags follow the content (item 8)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from apps.cli.main import main
from apps.core.spec import STACKS_DIR
from tests.infra.conftest import kube_objects


def _spec_with_caps(tmp_path: Path, caps: dict[str, int]) -> Path:
    data = yaml.safe_load((STACKS_DIR / "prod.yaml").read_text(encoding="utf-8"))
    data["gpu_pool_caps"] = caps
    path = tmp_path / "capped.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_plan_fails_when_the_replica_maxima_exceed_a_pool_cap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The brief's 16 GPUs cannot hold prod's replica maxima (35 on the on-demand pool: the brief's
    # 32 and the embedding model's 3 one-GPU nodes).
    assert main(["plan", "--stack", str(_spec_with_caps(tmp_path, {"gpu-l40s": 16}))]) == 2
    err = capsys.readouterr().err.strip()
    assert "gpu_pool_caps.gpu-l40s" in err
    assert "need 35" in err
    assert "bge-m3 3" in err
    assert "\n" not in err


def test_plan_prints_the_pool_limits_and_headroom(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--stack", str(_spec_with_caps(tmp_path, {"gpu-l40s": 40}))]) == 0
    out = capsys.readouterr().out
    assert "NodePool gpu-l40s: nvidia.com/gpu limit 35 at the replica maxima (cap 40, headroom 5)" in out


def test_nodepool_limits_are_the_planner_arithmetic(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--stack", "prod"]) == 0
    out = capsys.readouterr().out
    for pool in (o for o in kube_objects("prod") if o["kind"] == "NodePool"):
        limit = pool["spec"]["limits"]["nvidia.com/gpu"]
        assert f"NodePool {pool['metadata']['name']}: nvidia.com/gpu limit {limit} " in out
