"""The agent relays assignments: chunks as engine bytes, done with the engine's usage,
cancel → upstream closed and `done(abort)` with counted tokens, errors in every shape.

The engine is enginesim in-process (`sim`); `FakeEngine` (`engine`) only for what vLLM sends and
enginesim does not: other versions' error bodies, merged chunks, no per-chunk usage, paced and
recorded requests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from apps.agent.engine import EngineClient
from apps.agent.relay import Outcome, Relay, RelayTimeouts, engine_body
from apps.core.error_table import TIMEOUT
from apps.core.protocol import node as proto
from apps.core.protocol.openai import SseSplitter
from apps.enginesim.faults import Faults
from tests.fakes.engine_sim import SimEngine, engine_sim
from tests.fakes.engine_sim import body as sim_body
from tests.fakes.fake_engine import MODEL, FakeEngine
from tests.fakes.fake_orchestrator import running_agent

FORCED_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}


class ListSink:
    def __init__(self) -> None:
        self.frames: list[proto.Chunk] = []
        self.first_flags: list[bool] = []

    async def send_chunk(self, frame: proto.Chunk, *, first: bool = False) -> None:
        self.frames.append(frame)
        self.first_flags.append(first)

    def events(self) -> list[bytes]:
        return SseSplitter().feed("".join(f.delta for f in self.frames).encode())


def _urgent_until_first_token(frames: list[proto.Chunk]) -> list[bool]:
    """What the relay marks urgent: each frame sent before any token went out (the role chunk,
    the first token's frame)."""
    flags, tokens = [], 0
    for f in frames:
        flags.append(tokens == 0)
        tokens += sum(1 for e in SseSplitter().feed(f.delta.encode()) if b'"role"' not in e)
    return flags


def _assign(fake: dict[str, Any] | None = None, **body: Any) -> proto.Assign:
    payload: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **body}
    if fake is not None:
        payload["x_fake"] = fake
    return proto.Assign(request_id="r1", model=MODEL, body=payload)


def _sim_assign(tokens: int | None = None, **body: Any) -> proto.Assign:
    return proto.Assign(request_id="r1", model="tiny", body=sim_body(tokens, **body))


async def _relay(
    engine: FakeEngine | SimEngine, assign: proto.Assign, sink: ListSink | None = None, **timeouts: float
) -> tuple[proto.Done | proto.Error, ListSink, Relay]:
    sink = sink or ListSink()
    async with aiohttp.ClientSession() as session:
        relay = Relay(assign, EngineClient(session, engine.url, 2.0), sink, RelayTimeouts(**timeouts))
        frame = await relay.run()
    return frame, sink, relay


@pytest.fixture
async def engine() -> Any:
    eng = FakeEngine(tokenize_count=33)
    await eng.start()
    yield eng
    await eng.stop()


@pytest.fixture
async def sim() -> Any:
    async with engine_sim() as running:
        yield running


def test_engine_body_forces_streaming_and_usage() -> None:
    body = engine_body(
        _assign(stream=False, stream_options={"include_usage": False, "continuous_usage_stats": False})
    )
    assert body["stream"] is True
    # Per-chunk usage is always asked for: the exact count after an abort (tally.py).
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert engine_body(_assign(stream_options={}))["stream_options"] == FORCED_OPTIONS
    assert engine_body(_assign())["model"] == MODEL


async def test_stream_forwards_engine_bytes_and_reports_usage(sim: SimEngine) -> None:
    frame, sink, relay = await _relay(sim, _sim_assign(5, stream=False))
    assert isinstance(frame, proto.Done)
    prompt = await sim.prompt_tokens()
    assert (frame.prompt_tokens, frame.completion_tokens, frame.finish_reason) == (prompt, 5, "length")
    assert frame.usage_event is not None
    assert json.loads(frame.usage_event)["usage"]["completion_tokens"] == 5
    events = sink.events()
    assert len(events) == 6  # role chunk + 5 tokens; usage chunk and [DONE] stripped
    assert sink.first_flags == _urgent_until_first_token(sink.frames)
    assert all(b'"choices":[]' not in e and e != b"[DONE]" for e in events)
    assert b'"role":"assistant"' in events[0]
    # The forced options reached the engine: it streamed (the client asked for no stream) with the
    # final usage chunk (`usage_event`) and the running usage on every chunk (`tally.seen`).
    assert all(b'"usage"' not in e for e in events)  # the per-chunk usage the client did not ask for
    assert relay.outcome is Outcome.COMPLETED
    # docs/architecture.md D5: usage from the engine, no counting when it reports
    assert relay.tally.seen


async def test_frames_up_to_the_first_token_are_urgent_and_the_rest_are_not(engine: FakeEngine) -> None:
    # Paced: the role chunk comes with the head; each token is its own piece. The role chunk and the
    # first token's frame lead the batch they are sent in; later tokens queue in order.
    frame, sink, relay = await _relay(engine, _assign({"tokens": 3, "prompt_tokens": 4, "pace_s": 0.05}))
    assert [b'"role"' in e for e in sink.events()] == [True, False, False, False]
    assert sink.first_flags == [True, True, False, False]
    assert isinstance(frame, proto.Done)
    assert (relay.events_sent, relay.tokens, frame.completion_tokens) == (4, 3, 3)


async def test_events_that_piled_up_while_the_relay_was_busy_go_out_as_one_frame(engine: FakeEngine) -> None:
    """A relay that falls behind catches up in one step (one frame for everything buffered), as
    with aiohttp's `readany`; one frame per event made a loaded agent fall further behind
    (seen in the chaos suite: heartbeats starved, healthy nodes declared dead)."""
    from tests.fakes.raw_http_server import poll_until

    class SlowSink(ListSink):
        async def send_chunk(self, frame: proto.Chunk, *, first: bool = False) -> None:
            await super().send_chunk(frame, first=first)
            if len(self.frames) == 1:  # busy until the engine has written every token
                await poll_until(lambda: sum(engine.generated.values()) == 20)

    sink = SlowSink()
    async with aiohttp.ClientSession() as session:
        relay = Relay(_assign({"tokens": 20}), EngineClient(session, engine.url, 2.0), sink, RelayTimeouts())
        frame = await relay.run()
    assert isinstance(frame, proto.Done)
    assert frame.completion_tokens == 20
    assert len(sink.events()) == 21  # role + 20 tokens, in order, nothing lost
    assert len(sink.frames) <= 2  # everything that piled up went as one frame (not one per event)


async def test_a_finished_stream_leaves_its_connection_to_the_next_request(sim: SimEngine) -> None:
    async with aiohttp.ClientSession() as session:
        client = EngineClient(session, sim.url, 2.0)
        try:
            used = []
            for _ in range(3):
                relay = Relay(_sim_assign(3), client, ListSink(), RelayTimeouts())
                assert isinstance(await relay.run(), proto.Done)
                idle = client._streams._idle
                assert len(idle) == 1  # back in the pool, not closed
                used.append(idle[0])
            assert used[0] is used[1] is used[2]  # one keep-alive connection served all three
        finally:
            await client.aclose()


async def test_forwarded_bytes_are_the_engine_events_verbatim(engine: FakeEngine) -> None:
    _, sink, _ = await _relay(engine, _assign({"tokens": 3}))
    text = "".join(f.delta for f in sink.frames)
    assert text.count("data: ") == 4
    assert text.endswith("\n\n")
    assert '"content":"t1 "' in text


@pytest.mark.parametrize(
    ("status", "shape", "want_status", "want_message"),
    [
        (400, "nested", 400, "bad max_tokens"),
        (400, "flat", 400, "bad max_tokens"),
        (404, "nested", 404, "bad max_tokens"),
        (401, "unauthorized", 502, "the engine refused the node agent (check its --api-key)"),
        (503, "nested", 503, "bad max_tokens"),
        (500, "flat", 502, "bad max_tokens"),
    ],
)
async def test_http_errors_in_every_vllm_shape(
    engine: FakeEngine, status: int, shape: str, want_status: int, want_message: str
) -> None:
    frame, sink, _ = await _relay(engine, _assign({"mode": "http_error", "status": status, "shape": shape}))
    assert isinstance(frame, proto.Error)
    assert (frame.status, frame.message, frame.chunks_sent) == (want_status, want_message, 0)
    assert (frame.prompt_tokens, frame.completion_tokens) == (0, 0)
    assert sink.frames == []


async def test_in_stream_error_before_any_chunk_is_retryable_information(engine: FakeEngine) -> None:
    frame, sink, _ = await _relay(engine, _assign({"mode": "stream_error", "after": 0}))
    assert isinstance(frame, proto.Error)
    assert (frame.status, frame.chunks_sent, frame.message) == (400, 0, "bad logprobs")
    assert sink.frames == []


async def test_in_stream_error_mid_stream_reports_usage_so_far(sim: SimEngine) -> None:
    sim.set_faults(Faults(error_after_tokens=3, fail_message="EngineCore died"))
    frame, _sink, relay = await _relay(sim, _sim_assign(20))
    assert isinstance(frame, proto.Error)
    assert frame.status == 502
    assert frame.message == "EngineCore died"
    assert frame.chunks_sent == 4  # role + 3 tokens reached the orchestrator
    # The running usage of the last chunk: the engine's own counts, no /tokenize round trip.
    assert (frame.prompt_tokens, frame.completion_tokens) == (await sim.prompt_tokens(), 3)
    assert relay.tally.seen
    assert relay.outcome is Outcome.FAILED


async def test_an_engine_without_per_chunk_usage_is_counted_in_chunks_and_tokenized(
    engine: FakeEngine,
) -> None:
    frame, _sink, relay = await _relay(
        engine, _assign({"mode": "stream_error", "after": 3, "chunk_usage": False})
    )
    assert isinstance(frame, proto.Error)
    assert frame.chunks_sent == 4
    assert (frame.prompt_tokens, frame.completion_tokens) == (33, 3)  # /tokenize + counted chunks
    assert engine.tokenize_requests[0]["messages"] == [{"role": "user", "content": "hi"}]
    assert not relay.tally.seen


async def test_engine_dying_mid_stream_is_an_error_with_partial_usage(sim: SimEngine) -> None:
    sim.set_faults(Faults(die_after_tokens=2))
    frame, sink, _ = await _relay(sim, _sim_assign(20))
    assert isinstance(frame, proto.Error)
    assert frame.status == 502
    assert frame.chunks_sent == 3
    assert (frame.prompt_tokens, frame.completion_tokens) == (await sim.prompt_tokens(), 2)
    assert len(sink.events()) == 3


async def test_engine_unreachable_is_retryable() -> None:
    async with engine_sim() as dead:
        pass  # the port is now closed
    frame, _sink, _ = await _relay(dead, _sim_assign(3))
    assert isinstance(frame, proto.Error)
    assert (frame.status, frame.chunks_sent) == (503, 0)


async def test_missing_usage_chunk_falls_back_to_counting(engine: FakeEngine) -> None:
    frame, _, _ = await _relay(engine, _assign({"mode": "no_usage", "tokens": 4}))
    assert isinstance(frame, proto.Done)
    assert (frame.prompt_tokens, frame.completion_tokens, frame.usage_event) == (33, 4, None)


async def test_per_chunk_usage_reaches_a_client_that_asked_for_it(engine: FakeEngine) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    frame, sink, relay = await _relay(engine, _assign({"tokens": 3}, stream_options=options))
    assert isinstance(frame, proto.Done)
    assert frame.completion_tokens == 3
    running = [json.loads(e)["usage"]["completion_tokens"] for e in sink.events()]
    assert running == [0, 1, 2, 3]  # the role chunk, then each token: the engine's bytes, kept
    assert relay.tally.keep_chunk_usage


async def test_idle_deadline_between_tokens(sim: SimEngine) -> None:
    # A 1.5 s stall after the first token against a 0.3 s idle limit (which a loaded machine's
    # pause between the role chunk and the first token must not reach).
    sim.set_faults(Faults(stall_s=1.5, stall_after_tokens=1))
    frame, _, _ = await _relay(sim, _sim_assign(200), idle_s=0.3, first_byte_s=5.0)
    assert isinstance(frame, proto.Error)
    assert (frame.status, frame.error_type) == (
        TIMEOUT.status,
        TIMEOUT.frame_type,
    )  # apps/core/error_table.py
    assert "timed out" in frame.message
    assert frame.chunks_sent == 2  # the role chunk and one token came, then nothing
    await sim.idle()  # the upstream connection was closed: the engine aborted the request
    assert await sim.finished() == 0


# -- through the whole agent (WebSocket + fake orchestrator) -------------------------


async def test_assign_over_the_websocket(tmp_path: Path) -> None:
    async with running_agent(tmp_path) as run:
        await run.orch.send(run.assign("a1", 4))
        done = await run.result("a1")
        assert isinstance(done, proto.Done)
        assert (done.prompt_tokens, done.completion_tokens) == (await run.engine.prompt_tokens(), 4)
        assert run.chunks("a1").count("data: ") == 5
        # the done frame comes after every chunk of its request
        kinds = [type(f).__name__ for _, f in run.orch.frames if getattr(f, "request_id", None) == "a1"]
        assert kinds[-1] == "Done"
        assert set(kinds[:-1]) == {"Chunk"}


async def test_cancel_closes_upstream_and_reports_tokens_so_far(tmp_path: Path) -> None:
    engine = FakeEngine(tokenize_count=99)
    async with running_agent(tmp_path, engine=engine) as run:
        await run.orch.send(run.assign("c1", fake={"mode": "infinite", "pace_s": 0.005, "prompt_tokens": 21}))
        await run.orch.wait_for(lambda _: run.chunks("c1").count("data: ") >= 4)
        await run.orch.send(proto.Cancel(request_id="c1"))
        done = await run.result("c1")
        assert isinstance(done, proto.Done)
        assert done.finish_reason == "abort"
        assert done.usage_event is None
        forwarded_tokens = run.chunks("c1").count("data: ") - 1  # minus the role chunk
        assert done.completion_tokens == forwarded_tokens >= 3
        assert done.prompt_tokens == 21  # the engine's running usage
        assert engine.tokenize_requests == []
        assert await engine.wait_aborted(1) == ["chatcmpl-fake-1"]
        assert run.agent.in_flight == []


async def test_cancel_bills_the_engines_running_usage_when_it_merges_tokens_into_chunks(
    tmp_path: Path,
) -> None:
    """vLLM under load puts several tokens into one chunk: after a cancel the bill is the running
    usage of the last chunk the node saw (what the engine generated), not the chunk count."""
    engine = FakeEngine(tokenize_count=99)
    async with running_agent(tmp_path, engine=engine) as run:
        fake = {"mode": "infinite", "pace_s": 0.005, "tokens_per_chunk": 3, "prompt_tokens": 17}
        await run.orch.send(run.assign("m1", fake=fake))
        await run.orch.wait_for(lambda _: run.chunks("m1").count("data: ") >= 4)
        await run.orch.send(proto.Cancel(request_id="m1"))
        done = await run.result("m1")
        assert isinstance(done, proto.Done)
        assert done.finish_reason == "abort"
        await engine.wait_aborted(1)
        forwarded = run.chunks("m1").count("data: ") - 1  # minus the role chunk
        assert done.completion_tokens == 3 * forwarded  # counting chunks would bill a third
        assert done.completion_tokens <= engine.generated["chatcmpl-fake-1"]  # it may have run ahead
        assert done.prompt_tokens == 17
        assert '"usage"' not in run.chunks("m1")  # the client never asked for per-chunk usage


async def test_wrong_model_and_unknown_cancel(tmp_path: Path) -> None:
    async with running_agent(tmp_path) as run:
        await run.orch.send(proto.Cancel(request_id="nobody"))
        await run.orch.send(proto.Assign(request_id="m1", model="other-70b", body={"messages": []}))
        err = await run.result("m1")
        assert isinstance(err, proto.Error)
        assert (err.status, err.chunks_sent) == (404, 0)
        assert await run.engine.metric("vllm:prompt_tokens_total") == 0  # nothing reached the engine


async def test_runaway_assignments_are_refused_retryably(tmp_path: Path) -> None:
    async with running_agent(tmp_path, max_in_flight=2) as run:
        for rid in ("o1", "o2"):
            await run.orch.send(run.assign(rid, endless=True))
        await run.orch.wait_for(lambda _: "data: " in run.chunks("o1") and "data: " in run.chunks("o2"))
        await run.orch.send(run.assign("o3", 1))
        err = await run.result("o3")
        assert isinstance(err, proto.Error)
        assert (err.status, err.chunks_sent) == (503, 0)
        assert run.engine.busy() == 2  # o1 and o2 only
