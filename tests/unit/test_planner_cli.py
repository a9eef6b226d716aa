"""`llmfleet plan`: the table and the JSON carry the brief's fleet; what-if flags change it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from apps.cli.main import main


def _plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    assert main(["plan", "--json", *args]) == 0
    data = json.loads(capsys.readouterr().out)
    assert isinstance(data, dict)
    return data


def test_json_has_the_documented_keys(capsys: pytest.CaptureFixture[str]) -> None:
    data = _plan_json(capsys, "--stack", "prod")
    fleet = data["fleet"]
    assert isinstance(fleet, dict)
    assert fleet["gpus_peak"] == 22
    assert fleet["gpus_onprem"] == 8
    assert fleet["gpus_cloud"] == 14
    assert fleet["cost_per_hour_peak_usd"] == 35.0
    assert fleet["cost_per_month_usd"] == 14600.0
    models = data["models"]
    assert isinstance(models, dict)
    m8 = models["llama-3.1-8b-instruct"]
    for key in ("kv_bytes_per_token", "streams_per_replica", "replicas", "gpus_per_replica", "gpus"):
        assert key in m8
    assert m8["kv_bytes_per_token"] == 131072
    assert round(m8["cost_per_million_tokens_usd"]["full"], 2) == 0.46
    assert round(m8["cost_per_million_tokens_usd"]["half"], 2) == 0.93


def test_table_shows_the_fleet(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--stack", "prod"]) == 0
    out = capsys.readouterr().out
    assert "GPUs at peak: 22  (on premises 8, cloud 14)" in out
    assert "14,600 USD" in out
    assert "128 KiB" in out


def test_stack_accepts_a_path(capsys: pytest.CaptureFixture[str]) -> None:
    data = _plan_json(capsys, "--stack", "stacks/dev.yaml")
    assert data["stack"] == "dev"


def test_what_if_streams_and_context(capsys: pytest.CaptureFixture[str]) -> None:
    data = _plan_json(capsys, "--streams", "llama-3.1-8b-instruct=64")
    assert data["models"]["llama-3.1-8b-instruct"]["replicas"] == 3  # type: ignore[index]
    data = _plan_json(capsys, "--context", "4096")
    m8 = data["models"]["llama-3.1-8b-instruct"]  # type: ignore[index]
    assert m8["streams_per_replica"] == 45


def test_what_if_beyond_bounds_warns(capsys: pytest.CaptureFixture[str]) -> None:
    data = _plan_json(capsys, "--streams", "llama-3.1-8b-instruct=400")
    assert any("outside [2, 8]" in w for w in data["warnings"])  # type: ignore[union-attr]


def test_console_script_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "apps.cli.main", "plan", "--stack", "prod"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "cloud 14" in out
