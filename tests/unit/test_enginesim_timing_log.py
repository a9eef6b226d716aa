"""enginesim's `--timing-log`: one JSON line per streamed request, with its `user` tag and two
monotonic clocks (arrival, first content chunk written); nothing without the option.

Non-streamed requests are not logged: they have no first content chunk, so no engine TTFT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from apps.core.errors import SpecError
from apps.enginesim.api import TimingLog
from apps.enginesim.cli import configure
from apps.enginesim.cli import run as cli_run
from apps.enginesim.faults import Faults
from apps.enginesim.server import EngineSimSettings, RunningEngine, start_enginesim

pytestmark = pytest.mark.timeout(30)


async def _started(tmp_path: Path, timing_log: str | None) -> RunningEngine:
    return await start_enginesim(EngineSimSettings(model="tiny", port=0, speed=50, timing_log=timing_log))


@pytest.fixture
async def logged(tmp_path: Path) -> AsyncIterator[tuple[RunningEngine, Path]]:
    path = tmp_path / "timing.jsonl"
    running = await _started(tmp_path, str(path))
    try:
        yield running, path
    finally:
        await running.close()


def _body(**extra: object) -> dict[str, object]:
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 4,
        **extra,
    }


async def _chat(url: str, body: dict[str, object]) -> bytes:
    async with aiohttp.ClientSession() as s, s.post(f"{url}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        return await resp.read()


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def _wait_lines(path: Path, n: int, deadline_s: float = 5.0) -> list[dict[str, object]]:
    """The log once it holds n lines: the engine writes them when its last stream's handler ends,
    which may be just after the client has read the whole body."""
    end = time.monotonic() + deadline_s
    while len(lines := _lines(path)) < n:
        if time.monotonic() > end:
            raise AssertionError(f"{len(lines)} lines in the timing log, expected {n}")
        await asyncio.sleep(0.01)
    return lines


async def test_streamed_request_writes_one_line_with_its_tag(logged: tuple[RunningEngine, Path]) -> None:
    sim, path = logged
    before = time.monotonic()
    raw = await _chat(sim.url, _body(stream=True, user="run-a-0"))
    after = time.monotonic()
    assert raw.endswith(b"data: [DONE]\n\n")
    lines = await _wait_lines(path, 1)
    assert len(lines) == 1
    line = lines[0]
    assert set(line) == {"user", "arrived", "first_content"}
    assert line["user"] == "run-a-0"
    arrived, first = line["arrived"], line["first_content"]
    assert isinstance(arrived, float)
    assert isinstance(first, float)
    # Same clock as this process: the engine's times fall inside the client's request.
    assert before <= arrived <= first <= after


async def test_no_text_and_untagged_requests_log_null(logged: tuple[RunningEngine, Path]) -> None:
    sim, path = logged
    raw = await _chat(sim.url, _body(stream=True, messages=[{"role": "user", "content": "secretword"}]))
    assert b"[DONE]" in raw
    assert (await _wait_lines(path, 1))[0]["user"] is None
    assert "secretword" not in path.read_text()


async def test_non_streamed_request_is_not_logged(logged: tuple[RunningEngine, Path]) -> None:
    sim, path = logged
    body = json.loads(await _chat(sim.url, _body(user="plain-0")))
    assert body["object"] == "chat.completion"
    await _chat(sim.url, _body(stream=True, user="streamed-0"))
    assert [line["user"] for line in await _wait_lines(path, 1)] == ["streamed-0"]


async def test_stream_dropped_before_content_is_not_logged(logged: tuple[RunningEngine, Path]) -> None:
    sim, path = logged
    sim.set_faults(Faults(die_after_tokens=0, times=1))
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{sim.url}/v1/chat/completions", json=_body(stream=True, user="dropped")) as resp,
    ):
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.read()
    await _chat(sim.url, _body(stream=True, user="after"))
    assert [line["user"] for line in await _wait_lines(path, 1)] == ["after"]


async def test_concurrent_streams_each_get_their_line(logged: tuple[RunningEngine, Path]) -> None:
    sim, path = logged
    await asyncio.gather(*(_chat(sim.url, _body(stream=True, user=f"c-{i}")) for i in range(8)))
    lines = await _wait_lines(path, 8)
    assert sorted(str(line["user"]) for line in lines) == sorted(f"c-{i}" for i in range(8))


def test_lines_wait_for_the_last_open_stream_or_a_full_batch(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    log = TimingLog(str(path), batch=3)
    log.open_streams = 3
    log.record("a", 1.0, 2.0)
    log.stream_ended()
    assert not path.exists()  # two streams still open: no write yet
    log.record("b", 1.0, 2.0)
    log.record("c", 1.0, 2.0)
    log.stream_ended()  # a full batch goes out
    assert [line["user"] for line in _lines(path)] == ["a", "b", "c"]
    log.record("d", 1.0, 2.5)
    log.close()  # shutdown writes what is pending even with a stream open
    assert _lines(path)[-1] == {"user": "d", "arrived": 1.0, "first_content": 2.5}


async def test_appends_across_restarts(tmp_path: Path) -> None:
    path = tmp_path / "timing.jsonl"
    path.write_text('{"user":"old","arrived":1.0,"first_content":2.0}\n')
    sim = await _started(tmp_path, str(path))
    try:
        await _chat(sim.url, _body(stream=True, user="new"))
    finally:
        await sim.close()
    assert [line["user"] for line in _lines(path)] == ["old", "new"]  # close() wrote everything


async def test_without_the_option_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    sim = await _started(tmp_path, None)
    try:
        assert sim.state.timing is None
        await _chat(sim.url, _body(stream=True, user="x-0"))
    finally:
        await sim.close()
    assert list(tmp_path.iterdir()) == []


async def test_user_must_be_a_string_as_in_vllm(logged: tuple[RunningEngine, Path]) -> None:
    sim, _ = logged
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{sim.url}/v1/chat/completions", json=_body(stream=True, user=5)) as resp,
    ):
        assert resp.status == 400
        assert (await resp.json())["error"]["param"] == "body.user"


def test_cli_flag_reaches_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[EngineSimSettings] = []

    async def fake_run(settings: EngineSimSettings) -> None:
        seen.append(settings)

    monkeypatch.setattr("apps.enginesim.cli.run_enginesim", fake_run)
    monkeypatch.setattr("apps.enginesim.cli.setup_logging", lambda: None)
    parser = argparse.ArgumentParser()
    configure(parser)
    assert cli_run(parser.parse_args(["--model", "tiny", "--timing-log", "/tmp/t.jsonl"])) == 0
    assert seen[0].timing_log == "/tmp/t.jsonl"
    with pytest.raises(SpecError):
        cli_run(parser.parse_args(["--timing-log", "/tmp/t.jsonl"]))  # still needs --model
