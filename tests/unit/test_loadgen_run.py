"""loadgen against an in-process enginesim: closed and open loop, abandon, errors, JSON keys, CLI."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator

import pytest

from apps.cli.main import main
from apps.core.errors import SpecError
from apps.enginesim.faults import Faults
from apps.enginesim.server import EngineSimSettings, RunningEngine, start_enginesim
from apps.loadgen.config import LoadConfig
from apps.loadgen.report import percentile
from apps.loadgen.runner import Unreachable, run_load


@pytest.fixture
async def sim() -> AsyncIterator[RunningEngine]:
    running = await start_enginesim(EngineSimSettings(model="tiny", port=0, speed=50))
    try:
        yield running
    finally:
        await running.close()


def _config(sim: RunningEngine, **kw: object) -> LoadConfig:
    base = {"base_url": f"{sim.url}/v1", "model": "tiny", "prompt_tokens": 32, "max_tokens": 16}
    return LoadConfig(**{**base, **kw})  # type: ignore[arg-type]


def test_percentile_interpolates() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([0.0, 10.0], 95) == pytest.approx(9.5)
    assert percentile([5.0], 99) == 5.0


async def test_closed_loop_counts_and_json_keys(sim: RunningEngine) -> None:
    report = await run_load(_config(sim, concurrency=4, requests=12))
    j = report.to_json()
    assert j["requests"] == {"total": 12, "ok": 12, "error": 0, "abandoned": 0}
    assert j["output_tokens"] == 12 * 16
    for key in ("p50", "p95", "p99"):
        assert j["ttft_ms"][key] > 0
    # At speed 50 several tokens can arrive in one read, so gaps may be 0; their number is exact.
    assert all(len(r.itls_s) == 15 for r in report.results)
    assert j["itl_ms"]["p95"] >= j["itl_ms"]["p50"] >= 0
    assert j["output_tokens_per_s"] > 0
    assert j["errors_by_status"] == {}
    assert "TTFT ms" in report.table()
    json.dumps(j)  # one serialisable document


async def test_prompt_length_reaches_the_engine(sim: RunningEngine) -> None:
    report = await run_load(_config(sim, requests=1, prompt_tokens=100))
    # enginesim's rule: one token per word, plus the chat template's 7.
    assert report.results[0].prompt_tokens == 107


async def test_open_loop_sends_the_requested_number(sim: RunningEngine) -> None:
    report = await run_load(_config(sim, concurrency=8, requests=10, rate=200.0))
    assert report.to_json()["mode"] == "open"
    assert report.to_json()["requests"]["ok"] == 10


async def test_ramp_spreads_the_first_requests_of_the_closed_loop(sim: RunningEngine) -> None:
    # Every request stalls 0.5 s (longer than the ramp), so each worker sends exactly one.
    sim.set_faults(Faults(stall_s=0.5, stall_after_tokens=1))
    report = await run_load(_config(sim, concurrency=4, requests=4, ramp_s=0.4, max_tokens=2))
    starts = sorted(r.start for r in report.results)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert report.to_json()["requests"]["ok"] == 4
    # One every 0.1 s, not four at once (a late wake-up of a loaded machine shortens one gap).
    assert all(g >= 0.05 for g in gaps), gaps


def test_ramp_bad_values_are_refused() -> None:
    with pytest.raises(SpecError, match="--ramp"):
        LoadConfig(base_url="http://x", model="m", ramp_s=-1).validate()
    with pytest.raises(SpecError, match="--ramp"):
        LoadConfig(base_url="http://x", model="m", ramp_s=1, rate=5).validate()


async def test_duration_mode_stops_sending(sim: RunningEngine) -> None:
    report = await run_load(_config(sim, concurrency=2, duration_s=0.3))
    ok = report.to_json()["requests"]["ok"]
    assert ok >= 1
    assert ok == len(report.results)  # every request that was sent finished before run_load returned


async def test_abandon_after_drops_streams_and_engine_frees_them(sim: RunningEngine) -> None:
    report = await run_load(_config(sim, concurrency=3, requests=6, max_tokens=500, abandon_after=2))
    j = report.to_json()
    assert j["requests"]["abandoned"] == 6
    assert j["requests"]["error"] == 0
    sched = sim.state.engine.scheduler
    end = time.monotonic() + 5
    while sched.has_work() and time.monotonic() < end:
        await asyncio.sleep(0.01)
    assert not sched.has_work()
    assert sched.used_blocks == 0


async def test_errors_are_counted_by_status(sim: RunningEngine) -> None:
    sim.set_faults(Faults(fail_status=429))
    j = (await run_load(_config(sim, concurrency=2, requests=4))).to_json()
    assert j["requests"]["error"] == 4
    assert j["errors_by_status"] == {"429": 4}
    assert j["rate_429"] == 1.0
    assert j["rate_503"] == 0.0


async def test_dropped_connection_is_an_incomplete_error(sim: RunningEngine) -> None:
    sim.set_faults(Faults(die_after_tokens=3))
    j = (await run_load(_config(sim, requests=2))).to_json()
    assert j["requests"]["error"] == 2
    assert j["errors_by_status"] == {"incomplete": 2}


async def test_unreachable_url_names_the_url() -> None:
    with pytest.raises(Unreachable, match=r"cannot reach http://127\.0\.0\.1:1/v1"):
        await run_load(LoadConfig(base_url="http://127.0.0.1:1/v1", model="x"))


def test_cli_unreachable_exits_2_with_url(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["loadgen", "--base-url", "http://127.0.0.1:1/v1", "--model", "x"])
    assert code == 2
    err = capsys.readouterr().err
    assert "http://127.0.0.1:1/v1" in err
    assert "Traceback" not in err


def test_cli_bad_input_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["loadgen", "--base-url", "ftp://x", "--model", "x"]) == 2
    assert "--base-url" in capsys.readouterr().err
