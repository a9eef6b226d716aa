"""loadgen's `tag`: a unique `user` per request, absolute send / first-content times, and the join
with an engine timing log (`apps/loadgen/transit.py`) that gives each request's transit time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from apps.cli.main import main
from apps.core.errors import SpecError
from apps.enginesim.server import EngineSimSettings, RunningEngine, start_enginesim
from apps.loadgen.client import Outcome, RequestResult
from apps.loadgen.config import LoadConfig
from apps.loadgen.runner import _body, run_load
from apps.loadgen.transit import (
    EngineTiming,
    added,
    join_transit,
    parse_timing_lines,
    read_timing_log,
)

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[RunningEngine]:
    settings = EngineSimSettings(model="tiny", port=0, speed=50, timing_log=str(tmp_path / "timing.jsonl"))
    running = await start_enginesim(settings)
    try:
        yield running
    finally:
        await running.close()


def _config(**kw: object) -> LoadConfig:
    base = {"base_url": "http://127.0.0.1:1/v1", "model": "tiny", "prompt_tokens": 16, "max_tokens": 4}
    return LoadConfig(**{**base, **kw})  # type: ignore[arg-type]


def test_tagged_bodies_carry_unique_users() -> None:
    config = _config(tag="run-x")
    users = [_body(config, i)["user"] for i in range(50)]
    assert users[:2] == ["run-x-0", "run-x-1"]
    assert len(set(users)) == 50


def test_untagged_bodies_have_no_user() -> None:
    assert "user" not in _body(_config(), 0)


def test_empty_tag_is_refused() -> None:
    with pytest.raises(SpecError, match="--tag"):
        _config(tag="").validate()


async def _joined(path: Path, n: int) -> dict[str, EngineTiming]:
    """The engine's timings once all n tagged requests are in its log (it writes them when its
    last stream's handler ends, possibly just after the client read `[DONE]`)."""
    end = time.monotonic() + 5
    while len(timings := read_timing_log(path)) < n:
        assert time.monotonic() < end, f"{len(timings)} of {n} timing lines"
        await asyncio.sleep(0.01)
    return timings


async def test_tagged_run_joins_every_request_with_the_engine_log(sim: RunningEngine, tmp_path: Path) -> None:
    config = _config(base_url=f"{sim.url}/v1", concurrency=4, requests=12, tag="t1")
    report = await run_load(config)
    results = report.results
    assert sorted(r.user for r in results if r.user) == sorted(f"t1-{i}" for i in range(12))
    for r in results:
        assert r.outcome is Outcome.OK
        assert r.sent_at is not None
        assert r.first_content_at is not None
        assert r.start <= r.sent_at <= r.first_content_at <= r.end
        assert r.client_ttft_s == pytest.approx(r.first_content_at - r.sent_at)
    timings = await _joined(tmp_path / "timing.jsonl", 12)
    stats = join_transit(results, timings)
    assert (stats.ok, stats.joined) == (12, 12)
    for r in results:
        assert r.user is not None
        engine = timings[r.user]
        assert r.sent_at is not None
        assert r.first_content_at is not None
        # One clock for both processes: the engine's interval sits inside the client's.
        assert r.sent_at <= engine.arrived <= engine.first_content <= r.first_content_at
    assert all(t >= 0 for t in stats.transits_s)
    p50, p99 = stats.p(50), stats.p(99)
    assert p50 is not None
    assert p99 is not None
    assert 0 <= p50 <= p99


def _result(
    user: str | None, sent: float, first: float | None, outcome: Outcome = Outcome.OK
) -> RequestResult:
    r = RequestResult(outcome, "200", sent, sent + 1, user=user)
    r.sent_at, r.first_content_at = sent, first
    return r


def test_join_subtracts_the_engine_ttft_per_request() -> None:
    results = [
        _result("a", 10.0, 10.300),  # client TTFT 300 ms, engine 290 ms: 10 ms in transit
        _result("b", 20.0, 20.104),  # client 104 ms, engine 100 ms: 4 ms
        _result("c", 30.0, 30.5),  # no engine line: not joined
        _result("d", 40.0, 40.5, Outcome.ERROR),  # not OK: not counted
        _result(None, 50.0, 50.5),  # untagged
    ]
    engine = {"a": EngineTiming(10.004, 10.294), "b": EngineTiming(20.001, 20.101), "d": EngineTiming(1, 2)}
    stats = join_transit(results, engine)
    assert (stats.ok, stats.joined) == (4, 2)
    assert sorted(stats.transits_s) == pytest.approx([0.004, 0.010])
    assert stats.p(50) == pytest.approx(7.0)
    assert stats.p(99) == pytest.approx(9.94)
    assert stats.to_json() == {"ok": 4, "joined": 2, "p50": 7.0, "p99": 9.94}


def test_join_of_nothing_has_no_percentiles() -> None:
    stats = join_transit([], {})
    assert stats.to_json() == {"ok": 0, "joined": 0, "p50": None, "p99": None}
    assert added(None, 1.0) is None
    assert added(5.0, 2.0) == 3.0


def test_parse_keeps_tagged_complete_lines_and_the_last_of_a_tag() -> None:
    lines = [
        '{"user":null,"arrived":1.0,"first_content":2.0}\n',
        '{"user":"a","arrived":1.0,"first_content":2.0}\n',
        '{"user":"a","arrived":3.0,"first_content":3.5}\n',
        "\n",
        '{"user":"b","arrived":1.0,"first_con',  # still being written
    ]
    assert parse_timing_lines(lines) == {"a": EngineTiming(3.0, 3.5)}
    assert EngineTiming(3.0, 3.5).ttft_s == 0.5


def test_missing_log_is_empty(tmp_path: Path) -> None:
    assert read_timing_log(tmp_path / "absent.jsonl") == {}


def test_cli_tag_flag_is_validated(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["loadgen", "--base-url", "http://127.0.0.1:1/v1", "--model", "x", "--tag", ""]) == 2
    assert "--tag" in capsys.readouterr().err
