"""`llmfleet simulate`'s inputs: traces, profiles, PromQL of the rendered triggers; bad input is exit 2."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from apps.core.errors import SpecError
from apps.simulate.promql import Samples, compile_query
from apps.simulate.trace import TraceRequest, parse_trace, write_trace
from infra.manifests.common import slug
from infra.manifests.keda import demand_query, pod_matcher


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "apps.cli.main", "simulate", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_jsonl_and_csv_traces_round_trip() -> None:
    rows = [TraceRequest(1.5, "m", "t", 100, 50, 40), TraceRequest(0.5, "m", "t", 10, 5, 9)]
    out = io.StringIO()
    write_trace(rows, out)
    assert parse_trace(out.getvalue()) == sorted(rows, key=lambda r: r.t)
    csv_text = "t,model,team,prompt_tokens,max_tokens,answer_tokens\n0.5,m,t,10,5,9\n"
    assert parse_trace(csv_text) == [rows[1]]


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (
            '{"t": 0, "model": "m", "team": "a", "prompt_tokens": 1, "max_tokens": 1, "answer_tokens": 1}\n{"t": 1,',
            ":2:",
        ),
        ("t,model,team,prompt_tokens,max_tokens,answer_tokens\n0,m,a,1,1,1\n1,m,a,x,1,1\n", ":3:"),
        (
            '{"t": -1, "model": "m", "team": "a", "prompt_tokens": 1, "max_tokens": 1, "answer_tokens": 1}\n',
            ":1:",
        ),
    ],
)
def test_a_malformed_line_names_its_number(text: str, where: str) -> None:
    with pytest.raises(SpecError) as exc:
        parse_trace(text, "trace.jsonl")
    assert f"trace.jsonl{where}" in exc.value.message


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"t": 0, "model": "llama-3.1-8b-instruct", "team": "a"}\n')
    unknown = tmp_path / "unknown.jsonl"
    unknown.write_text(
        '{"t": 0, "model": "gpt-9", "team": "a", "prompt_tokens": 1, "max_tokens": 1, "answer_tokens": 1}\n'
    )
    cases = [
        (["--profile", "lunch-rush"], "unknown profile 'lunch-rush'"),
        (["--trace", str(bad)], "bad.jsonl:1: missing field(s)"),
        (["--trace", str(unknown)], "gpt-9"),
    ]
    for args, needle in cases:
        proc = _cli(*args)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert needle in lines[0]


def _samples(rows: list[tuple[float, dict[str, list[tuple[tuple[tuple[str, str], ...], float]]]]]) -> Samples:
    s = Samples()
    for t, frame in rows:
        s.add(t, frame)
    return s


def test_the_rendered_demand_query_sums_replicas_and_holds_the_max_for_two_minutes() -> None:
    model = "qwen2.5-32b-instruct"
    q = compile_query(demand_query(model))
    queue = "llmfleet_orchestrator_queue_depth"
    lab = (("model", model), ("replica", "orchestrator-0"))
    lab1 = (("model", model), ("replica", "orchestrator-1"))
    other = (("model", "other"), ("replica", "orchestrator-0"))
    run = (("model_name", model), ("pod", "p1"))
    s = _samples(
        [
            (0.0, {}),
            (15.0, {queue: [(lab, 3.0), (lab1, 4.0), (other, 50.0)]}),
            (30.0, {queue: [(lab, 0.0), (lab1, 0.0)], "vllm:num_requests_running": [(run, 5.0)]}),
            (45.0, {queue: [(lab, 0.0), (lab1, 0.0)]}),
        ]
        + [(15.0 * k, {queue: [(lab, 0.0)]}) for k in range(4, 20)]
    )
    assert q(s, 0.0) == 0.0  # no series at all: `or vector(0)` keeps it at 0, not empty
    assert q(s, 15.0) == 7.0  # summed over orchestrator replicas, the other model excluded
    assert q(s, 30.0) == 7.0  # max over the window: the queue aged out but still counts
    assert q(s, 120.0) == 7.0  # t=15 is inside (0, 120]... (120 - 120, 120] starts after 0
    assert q(s, 135.0) == 5.0  # 15 left the window; the running streams at 30 remain
    assert q(s, 150.0) == 0.0
    with_base = compile_query(demand_query(model, 1, 16.0))
    assert with_base(s, 15.0) == 0.0  # clamp_min(7 - 16, 0)


def test_the_canary_pod_matchers_split_the_models_pods_as_prometheus_does() -> None:
    """With a canary, the stable's query counts every pod but the canary's (`pod!~`) and the canary's
    only its own (`pod=~`, anchored). Before, the simulator skipped both matchers and summed all pods."""
    model = "qwen2.5-32b-instruct"
    canary = f"vllm-{slug(model)}-canary"
    stable_q = compile_query(demand_query(model, pods=pod_matcher(canary, own=False)))
    canary_q = compile_query(demand_query(model, pods=pod_matcher(canary), orchestrator=False))
    running = "vllm:num_requests_running"
    pods = {
        f"vllm-{slug(model)}-5f8d9c-00001": 3.0,
        f"{canary}-5f8d9c-00002": 5.0,
        f"{canary}-x": 100.0,  # not a pod of the canary's Deployment: the regex is anchored
    }
    s = _samples([(0.0, {running: [((("model_name", model), ("pod", p)), v) for p, v in pods.items()]})])
    assert stable_q(s, 0.0) == 103.0
    assert canary_q(s, 0.0) == 5.0


@pytest.mark.parametrize("selector", ['{pod~"x"}', '{pod="x" junk}', "{pod=x}"])
def test_a_matcher_it_cannot_read_is_refused_not_skipped(selector: str) -> None:
    with pytest.raises(SpecError, match="unsupported label matcher"):
        compile_query(f"sum(vllm:num_requests_running{selector})")
