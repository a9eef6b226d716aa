"""vLLM's per-request `priority` under `--scheduling-policy priority`: accepted by enginesim and the
real vLLM alike, and (enginesim) with the batch full the higher priority (lower value) is admitted
first when a slot frees (the orchestrator sends `interactive` as 0 and `batch` as 10)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.conformance.conftest import MAX_NUM_SEQS, EngineUnderTest
from tests.conformance.helpers import chat_body, metric, metric_values, poll_until, stream_chat

INTERACTIVE, BATCH = 0, 10


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=120.0) as c:
        yield c


def test_priority_field_is_accepted(engine: EngineUnderTest, client: httpx.Client) -> None:
    for priority in (INTERACTIVE, BATCH):
        body = chat_body(engine.model, max_tokens=3, stream=True, priority=priority)
        res = stream_chat(client, engine.url, body)
        assert res.status == 200, res.payloads
        assert res.payloads[-1] == "[DONE]"


def _first_content_at(url: str, body: dict[str, Any], started: list[float] | None = None) -> float:
    """When the first content chunk of a streamed request arrived (monotonic seconds); `started`
    gets an entry when the response headers arrived (the server has taken the request)."""
    with (
        httpx.Client(timeout=120.0) as c,
        c.stream("POST", f"{url}/v1/chat/completions", json=body) as resp,
    ):
        assert resp.status_code == 200
        if started is not None:
            started.append(time.monotonic())  # list.append is atomic across threads
        first: float | None = None
        for line in resp.iter_lines():
            payload = line[5:].strip() if line.startswith("data:") else "[DONE]"
            if first is None and payload != "[DONE]":
                choices = json.loads(payload).get("choices") or [{}]
                if choices[0].get("delta", {}).get("content"):
                    first = time.monotonic()
    assert first is not None
    return first


def _stream(url: str, body: dict[str, Any], progress: list[int] | None = None) -> int:
    """Stream a request to its end; `progress[0]` counts the events received so far."""
    with (
        httpx.Client(timeout=120.0) as c,
        c.stream("POST", f"{url}/v1/chat/completions", json=body) as resp,
    ):
        for line in resp.iter_lines():
            if progress is not None and line.startswith("data:"):
                progress[0] += 1
        return resp.status_code


def _count(client: httpx.Client, url: str, name: str) -> float:
    return metric(metric_values(client, url), name)


def test_a_full_batch_admits_the_higher_priority_first(enginesim_server: EngineUnderTest) -> None:
    """enginesim only, for now: on the real vLLM 0.32 with the tiny model this box could not make the
    ordering observable deterministically (a 900-token request runs in ~2 s, the response headers
    and events of a loaded server arrive late and coalesced; 1 pass in 4 runs, the failures with the
    interactive request started right after the last batch one, i.e. submitted too late or not
    reordered — not settled). The real vLLM is checked to accept both priorities above.

    A full batch of long batch requests and six batches' worth more waiting behind it; then
    one interactive request. Under the priority policy it is admitted at the next free slot, ahead
    of the waiting batch requests that arrived before it (so before the last of them starts); under
    fcfs it would start after all of them. The waiting requests are known to be taken once the
    server answered their headers (the engine's /metrics answers too slowly under load to poll)."""
    url, model = enginesim_server.url, enginesim_server.model
    long = {"max_tokens": 900, "ignore_eos": True, "stream": True, "priority": BATCH}
    waves = 6 * MAX_NUM_SEQS
    progress = [[0] for _ in range(MAX_NUM_SEQS)]
    with ThreadPoolExecutor(MAX_NUM_SEQS + waves + 1) as pool:
        fills = [
            pool.submit(_stream, url, chat_body(model, content="fill", **long), progress[i])
            for i in range(MAX_NUM_SEQS)
        ]
        poll_until(lambda: all(p[0] > 0 for p in progress), 60)  # the batch is full
        started: list[float] = []
        waiting = [
            pool.submit(_first_content_at, url, chat_body(model, content=f"b{i}", **long), started)
            for i in range(waves)
        ]
        # Every waiting request's headers are back: the server has taken them all, and they keep
        # the batch full for several rounds (the tiny model runs a long request in about 2 s).
        poll_until(lambda: len(started) >= waves, 60)
        urgent = pool.submit(
            _first_content_at,
            url,
            chat_body(model, content="now", max_tokens=2, ignore_eos=True, stream=True, priority=INTERACTIVE),
        )
        batch_firsts = [f.result(timeout=120) for f in waiting]
        urgent_first = urgent.result(timeout=120)
        for f in fills:
            assert f.result(timeout=120) == 200
    # It arrived after every waiting batch request but started before the last of them.
    assert urgent_first < max(batch_firsts), (urgent_first, sorted(batch_firsts))
