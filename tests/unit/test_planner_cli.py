"""`llmfleet plan`: the table and the JSON carry the brief's fleet; what-if flags change it."""

from __future__ import annotations

import json
import re
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
    assert fleet["gpus_peak"] == 24  # the brief's 22 and the embedding model's 2
    assert fleet["gpus_onprem"] == 8
    assert fleet["gpus_cloud"] == 16
    assert fleet["cost_per_hour_peak_usd"] == 40.0
    assert fleet["cost_per_month_usd"] == 16425.0
    models = data["models"]
    assert isinstance(models, dict)
    m8 = models["llama-3.1-8b-instruct"]
    for key in ("kv_bytes_per_token", "streams_per_replica", "replicas", "gpus_per_replica", "gpus"):
        assert key in m8
    assert m8["kv_bytes_per_token"] == 131072
    assert round(m8["cost_per_million_tokens_usd"]["full"], 2) == 0.46
    assert round(m8["cost_per_million_tokens_usd"]["half"], 2) == 0.93
    assert m8["task"] == "generate"
    embedding = models["bge-m3"]
    assert (embedding["task"], embedding["embedding_dimensions"]) == ("embed", 1024)
    assert (embedding["kv_bytes_per_token"], embedding["kv_blocks_per_replica"]) == (0, 0)
    assert (embedding["streams_target"], embedding["replicas"], embedding["gpus"]) == (78, 2, 2)
    assert embedding["prompt_tokens_per_s_per_replica"] == 40000
    assert round(embedding["cost_per_million_tokens_usd"]["full"], 4) == 0.0174


def test_table_shows_the_fleet(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--stack", "prod"]) == 0
    out = capsys.readouterr().out
    assert "GPUs at peak: 24  (on premises 8, cloud 16)" in out
    assert "16,425 USD" in out
    assert "128 KiB" in out


def _row(out: str, header: str, model: str) -> dict[str, str]:
    """One model's cells of the table whose header line starts with `header`, by column name (the
    dashes under the header give each column's span; headers may contain spaces)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    spans = [(m.start(), m.end()) for m in re.finditer(r"-+", lines[start + 1])]
    row = next(line for line in lines[start + 2 :] if line.startswith(model + " "))
    return {lines[start][a:b].strip(): row[a:b].strip() for a, b in spans}


def test_the_embedding_model_has_its_own_tables(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--stack", "prod"]) == 0
    out = capsys.readouterr().out
    chat_tables = out.split("embedding model")[0]
    assert "bge-m3" not in chat_tables  # no KV cache, no decode: not in the KV and decode tables
    capacity = _row(out, "embedding model  dims", "bge-m3")
    assert capacity["dims"] == "1024"
    assert (capacity["weights"], capacity["activations"]) == ("1.1 GiB", "0.22 GiB")
    assert (capacity["input"], capacity["max-model-len"]) == ("512", "8,192")
    assert (capacity["target"], capacity["max-num-seqs"], capacity["peak"]) == ("78", "78", "100")
    assert (capacity["replicas"], capacity["bounds"], capacity["GPUs"]) == ("2", "1..3", "2")
    economics = _row(out, "embedding model  prompt", "bge-m3")
    assert economics["prompt tok/s/replica"] == "40,000"
    assert (economics["USD/M full"], economics["USD/M 50%"]) == ("0.017", "0.035")
    assert (economics["s/input"], economics["inputs/s/replica"]) == ("1.00", "78.1")
    assert economics["credits/M prompt"] == "0.0500"


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
    assert "cloud 16" in out
