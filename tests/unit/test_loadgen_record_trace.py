"""`llmfleet loadgen --record-trace`: what it writes, `llmfleet simulate --trace` reads."""

from __future__ import annotations

from pathlib import Path

from apps.loadgen.client import Outcome, RequestResult
from apps.loadgen.config import LoadConfig
from apps.loadgen.report import LoadReport
from apps.loadgen.trace import write_trace
from apps.simulate.trace import TraceRequest, load_trace


def test_a_recorded_run_replays_as_a_trace(tmp_path: Path) -> None:
    config = LoadConfig(
        base_url="http://x/v1", model="llama-3.1-8b-instruct", prompt_tokens=64, max_tokens=32
    )
    results = [
        RequestResult(
            Outcome.OK, "200", 10.5, 12.0, token_chunks=32, usage_completion_tokens=30, prompt_tokens=70
        ),
        RequestResult(Outcome.OK, "200", 10.0, 11.0, token_chunks=12),
        RequestResult(Outcome.ERROR, "503", 11.0, 11.1),
    ]
    path = tmp_path / "run.jsonl"
    write_trace(str(path), LoadReport(config, 2.0, results), config)
    assert "content" not in path.read_text()
    assert load_trace(path) == [
        TraceRequest(0.0, "llama-3.1-8b-instruct", "loadgen", 64, 32, 12),
        TraceRequest(0.5, "llama-3.1-8b-instruct", "loadgen", 70, 32, 30),
        TraceRequest(1.0, "llama-3.1-8b-instruct", "loadgen", 64, 32, 32),
    ]
