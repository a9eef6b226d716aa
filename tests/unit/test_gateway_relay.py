"""`RelayResponse` with a fake upstream and a fake ASGI client: deadlines, truncation, disconnect."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

from apps.core.protocol.openai import SSE_DONE
from apps.gateway.relay import USAGE_WINDOW_READS, RelayOutcome, RelayResponse


class ScriptedUpstream:
    status = 200
    headers: Mapping[str, str] = {}

    def __init__(self, parts: list[bytes], hang_after: bool = False) -> None:
        self.parts = parts
        self.hang_after = hang_after
        self.closed = False
        self.generator_finished = asyncio.Event()

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            for part in self.parts:
                yield part
            if self.hang_after:
                await asyncio.Event().wait()
        finally:
            self.generator_finished.set()

    async def read_body(self) -> bytes:
        return b""

    async def aclose(self) -> None:
        self.closed = True


class FakeClient:
    def __init__(self, disconnect_after_bytes: int | None = None) -> None:
        self.sent: list[dict[str, Any]] = []
        self._disconnect = asyncio.Event()
        self._limit = disconnect_after_bytes

    async def receive(self) -> dict[str, Any]:
        await self._disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        if self._limit is not None and len(self.body()) >= self._limit:
            self._disconnect.set()

    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")


async def run_relay(
    upstream: ScriptedUpstream, client: FakeClient, **kw: Any
) -> tuple[RelayOutcome, list[str]]:
    calls: list[str] = []

    async def cleanup(outcome: RelayOutcome) -> None:
        await upstream.aclose()
        calls.append(outcome.ended)

    relay = RelayResponse(
        upstream,
        headers={"x-request-id": "r"},
        first_token_s=kw.get("first_token_s", 5.0),
        idle_s=kw.get("idle_s", 5.0),
        watch_usage=True,
        cleanup=cleanup,
        cleanup_timeout_s=2.0,
        max_request_s=kw.get("max_request_s"),
        fast_paths="on",
    )
    await relay({"type": "http"}, client.receive, client.send)
    return relay.outcome, calls


CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}\n\n'


async def test_bytes_relayed_unchanged_and_usage_noted() -> None:
    client = FakeClient()
    outcome, calls = await run_relay(ScriptedUpstream([CHUNK, USAGE[:20], USAGE[20:], SSE_DONE]), client)
    assert client.body() == CHUNK + USAGE + SSE_DONE
    assert client.sent[0]["status"] == 200
    assert (b"x-request-id", b"r") in client.sent[0]["headers"]
    assert outcome.ended == "done"
    assert outcome.completion_tokens == 1
    assert calls == ["done"]


async def test_upstream_without_done_gets_error_event() -> None:
    client = FakeClient()
    outcome, calls = await run_relay(ScriptedUpstream([CHUNK]), client)
    assert outcome.ended == "upstream_error"
    assert client.body().startswith(CHUNK + b'data: {"error"')
    assert client.body().endswith(SSE_DONE)
    assert calls == ["upstream_error"]


async def test_idle_timeout_ends_stream_with_error() -> None:
    client = FakeClient()
    upstream = ScriptedUpstream([CHUNK], hang_after=True)
    outcome, calls = await run_relay(upstream, client, idle_s=0.05)
    assert outcome.ended == "timeout"
    assert b"idle timeout" in client.body()
    assert client.body().endswith(SSE_DONE)
    assert upstream.closed
    assert calls == ["timeout"]


async def test_first_token_timeout() -> None:
    client = FakeClient()
    outcome, _ = await run_relay(ScriptedUpstream([], hang_after=True), client, first_token_s=0.05)
    assert outcome.ended == "timeout"
    assert b"first token timeout" in client.body()


async def test_max_request_time_ends_a_stream_that_is_never_idle_long_enough() -> None:
    # The idle and first-token deadlines are far away: only the whole-stream bound can end it, so
    # a stream never outlives its slot's lease (max_request_s + margin).
    client = FakeClient()
    upstream = ScriptedUpstream([CHUNK, CHUNK], hang_after=True)
    outcome, calls = await run_relay(upstream, client, first_token_s=30.0, idle_s=30.0, max_request_s=0.05)
    assert outcome.ended == "timeout"
    assert b"maximum request time" in client.body()
    assert client.body().endswith(SSE_DONE)
    assert upstream.closed
    assert calls == ["timeout"]


async def test_client_disconnect_cancels_relay_and_cleans_up() -> None:
    client = FakeClient(disconnect_after_bytes=1)
    upstream = ScriptedUpstream([CHUNK], hang_after=True)
    outcome, calls = await run_relay(upstream, client)
    assert outcome.ended == "disconnect"
    assert upstream.closed
    assert calls == ["disconnect"]
    assert client.body() == CHUNK  # nothing is written after the client left


class HeadWithChunkUpstream(ScriptedUpstream):
    """The dispatcher's upstream when the first chunk arrived in the same read as the head."""

    def __init__(self, buffered: bytes) -> None:
        super().__init__([], hang_after=True)
        self.buffered = buffered

    def take_buffered(self) -> bytes:
        data, self.buffered = self.buffered, b""
        return data


async def test_first_chunk_that_came_with_the_head_is_written_before_the_relay_loop_runs() -> None:
    # The upstream's `chunks()` never yields: only the inline write can deliver the first chunk.
    client = FakeClient(disconnect_after_bytes=len(CHUNK))
    upstream = HeadWithChunkUpstream(CHUNK)
    outcome, calls = await run_relay(upstream, client, first_token_s=3.0)
    assert client.body() == CHUNK
    assert outcome.first_byte_at is not None
    assert outcome.ended == "disconnect"  # the client left after the chunk, not a first-token timeout
    assert calls == ["disconnect"]


async def test_cleanup_runs_even_when_the_response_task_is_cancelled() -> None:
    client = FakeClient()
    upstream = ScriptedUpstream([CHUNK], hang_after=True)
    task = asyncio.ensure_future(run_relay(upstream, client))
    await asyncio.wait_for(_first_body(client), 5)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    else:
        raise AssertionError("cancellation must be re-raised")
    assert upstream.closed


async def _first_body(client: FakeClient) -> None:
    while not client.body():
        await asyncio.sleep(0)


async def test_done_split_over_single_byte_reads_is_recognised() -> None:
    client = FakeClient()
    parts = [CHUNK] + [SSE_DONE[i : i + 1] for i in range(len(SSE_DONE))]
    outcome, calls = await run_relay(ScriptedUpstream(parts), client)
    assert outcome.ended == "done"
    assert client.body() == CHUNK + SSE_DONE
    assert calls == ["done"]


async def test_usage_found_after_many_content_chunks_in_one_final_read() -> None:
    client = FakeClient()
    outcome, _ = await run_relay(ScriptedUpstream([CHUNK] * 500 + [USAGE + SSE_DONE]), client)
    assert outcome.ended == "done"
    assert (outcome.prompt_tokens, outcome.completion_tokens) == (3, 1)


async def test_usage_split_beyond_the_window_is_relayed_but_not_counted() -> None:
    # Documented limit: the gateway's token metric needs the usage event within the last reads;
    # the bytes (and the orchestrator's billing) are unaffected.
    client = FakeClient()
    pieces = [USAGE[i : i + 4] for i in range(0, len(USAGE), 4)]
    assert len(pieces) > USAGE_WINDOW_READS
    outcome, _ = await run_relay(ScriptedUpstream([CHUNK, *pieces, SSE_DONE]), client)
    assert outcome.ended == "done"
    assert client.body() == CHUNK + USAGE + SSE_DONE
    assert outcome.completion_tokens is None


async def test_usage_not_watched_when_the_client_did_not_ask() -> None:
    client = FakeClient()
    upstream = ScriptedUpstream([CHUNK, USAGE, SSE_DONE])

    async def cleanup(outcome: RelayOutcome) -> None:
        await upstream.aclose()

    relay = RelayResponse(
        upstream,
        headers={},
        first_token_s=5.0,
        idle_s=5.0,
        watch_usage=False,
        cleanup=cleanup,
        cleanup_timeout_s=2.0,
        fast_paths="on",
    )
    await relay({"type": "http"}, client.receive, client.send)
    assert relay.outcome.ended == "done"
    assert relay.outcome.completion_tokens is None
    assert upstream.closed


class ServerLikeClient(FakeClient):
    """Like uvicorn: `receive()` answers `http.disconnect` once the final body part was sent."""

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self._disconnect.set()
            await asyncio.sleep(0)  # let the watcher run before the relay task finishes


async def test_disconnect_reported_after_the_last_byte_is_not_a_client_abort() -> None:
    upstream = ScriptedUpstream([CHUNK, CHUNK, SSE_DONE])
    outcome, calls = await asyncio.wait_for(run_relay(upstream, ServerLikeClient()), 10)
    assert outcome.ended == "done"
    assert calls == ["done"]
