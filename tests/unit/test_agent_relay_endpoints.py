"""The agent relays the other endpoints (issue 31): an embeddings answer goes out as one chunk whose
one event is the engine's body, then `done` with its prompt tokens; a completion streams like a chat.
A scripted engine (`FakeEngine`) for the answers enginesim never gives (no usage, over the bound,
written over several lines); enginesim for the normal ones."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from apps.agent import relay as relay_module
from apps.agent.engine import EngineClient
from apps.agent.relay import MAX_ANSWER_BYTES, Relay, RelayTimeouts
from apps.core.protocol import node as proto
from apps.core.protocol.openai import SseSplitter
from tests.fakes.fake_engine import MODEL, FakeEngine

pytestmark = pytest.mark.timeout(30)


class ListSink:
    def __init__(self) -> None:
        self.frames: list[proto.Chunk] = []

    async def send_chunk(self, frame: proto.Chunk, *, first: bool = False) -> None:
        self.frames.append(frame)

    def events(self) -> list[bytes]:
        return SseSplitter().feed("".join(f.delta for f in self.frames).encode())


def _embed(fake: dict[str, Any] | None = None, inputs: Any = ("a", "b")) -> proto.Assign:
    body: dict[str, Any] = {"model": MODEL, "input": list(inputs)}
    if fake is not None:
        body["x_fake"] = fake
    return proto.Assign(request_id="e1", model=MODEL, body=body, endpoint="embeddings")


async def _run(engine: FakeEngine, assign: proto.Assign) -> tuple[proto.Done | proto.Error, ListSink]:
    sink = ListSink()
    async with aiohttp.ClientSession() as session:
        relay = Relay(assign, EngineClient(session, engine.url, 2.0), sink, RelayTimeouts())
        frame = await relay.run()
    return frame, sink


@pytest.fixture
async def engine() -> Any:
    eng = FakeEngine()
    await eng.start()
    yield eng
    await eng.stop()


async def test_an_embeddings_answer_is_one_event_and_done_bills_its_prompt(engine: FakeEngine) -> None:
    frame, sink = await _run(engine, _embed({"dims": 3}))
    assert isinstance(frame, proto.Done)
    assert (frame.prompt_tokens, frame.completion_tokens) == (6, 0)
    (event,) = sink.events()
    answer = json.loads(event)
    assert [d["embedding"] for d in answer["data"]] == [[0.5] * 3, [0.5] * 3]
    assert answer["usage"] == {"prompt_tokens": 6, "total_tokens": 6}
    sent = engine.requests[-1]
    assert "stream" not in sent
    assert "max_tokens" not in sent
    assert sent["input"] == ["a", "b"]


async def test_an_answer_over_several_lines_still_makes_one_event(engine: FakeEngine) -> None:
    frame, sink = await _run(engine, _embed({"mode": "pretty"}))
    assert isinstance(frame, proto.Done)
    (event,) = sink.events()
    assert b"\n" not in event
    assert len(json.loads(event)["data"]) == 2


async def test_an_answer_without_usage_fails_and_forwards_nothing(engine: FakeEngine) -> None:
    frame, sink = await _run(engine, _embed({"mode": "no_usage"}))
    assert isinstance(frame, proto.Error)
    assert (frame.status, frame.chunks_sent) == (502, 0)
    assert sink.frames == []


async def test_an_answer_over_the_frame_bound_is_a_400_not_retried_elsewhere(
    engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(relay_module, "MAX_ANSWER_BYTES", 4096)
    frame, sink = await _run(engine, _embed({"mode": "huge", "huge": 8192}))
    assert isinstance(frame, proto.Error)
    assert (frame.status, frame.chunks_sent) == (400, 0)  # a 4xx: the orchestrator does not retry it
    assert "fewer inputs" in frame.message
    assert sink.frames == []
    assert MAX_ANSWER_BYTES < 8 * 1024 * 1024  # under the orchestrator's message bound


async def test_the_engines_refusal_of_an_embeddings_request_reaches_the_client(engine: FakeEngine) -> None:
    frame, _ = await _run(engine, _embed({"mode": "http_error", "status": 400}))
    assert isinstance(frame, proto.Error)
    assert (frame.status, frame.message, frame.chunks_sent) == (400, "bad input", 0)
