"""vLLM's per-request `priority` under `--scheduling-policy priority`: accepted, and with the batch
full the higher priority (lower value) is admitted first when a slot frees — on enginesim and on
the real vLLM alike (the orchestrator sends `interactive` as 0 and `batch` as 10)."""

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


def _first_content_at(url: str, body: dict[str, Any]) -> float:
    """When the first content chunk of a streamed request arrived (monotonic seconds)."""
    with (
        httpx.Client(timeout=120.0) as c,
        c.stream("POST", f"{url}/v1/chat/completions", json=body) as resp,
    ):
        assert resp.status_code == 200
        first: float | None = None
        for line in resp.iter_lines():
            payload = line[5:].strip() if line.startswith("data:") else "[DONE]"
            if first is None and payload != "[DONE]":
                choices = json.loads(payload).get("choices") or [{}]
                if choices[0].get("delta", {}).get("content"):
                    first = time.monotonic()
    assert first is not None
    return first


def _stream(url: str, body: dict[str, Any]) -> int:
    with httpx.Client(timeout=120.0) as c:
        return stream_chat(c, url, body).status


def _count(client: httpx.Client, url: str, name: str) -> float:
    return metric(metric_values(client, url), name)


def test_a_full_batch_admits_the_higher_priority_first(engine: EngineUnderTest, client: httpx.Client) -> None:
    url, model = engine.url, engine.model
    # Long enough that the batch stays full while the waiting requests line up.
    fill = chat_body(model, content="fill", max_tokens=900, ignore_eos=True, stream=True, priority=BATCH)
    short = {"max_tokens": 2, "ignore_eos": True, "stream": True}
    with ThreadPoolExecutor(MAX_NUM_SEQS + 4) as pool:
        fills = [pool.submit(_stream, url, fill) for _ in range(MAX_NUM_SEQS)]
        poll_until(lambda: _count(client, url, "vllm:num_requests_running") >= MAX_NUM_SEQS, 60)
        waiting = [
            pool.submit(_first_content_at, url, chat_body(model, content=f"b{i}", priority=BATCH, **short))
            for i in range(3)
        ]
        poll_until(lambda: _count(client, url, "vllm:num_requests_waiting") >= 3, 30)
        urgent = pool.submit(
            _first_content_at, url, chat_body(model, content="now", priority=INTERACTIVE, **short)
        )
        poll_until(lambda: _count(client, url, "vllm:num_requests_waiting") >= 4, 30)
        batch_firsts = [f.result(timeout=120) for f in waiting]
        urgent_first = urgent.result(timeout=120)
        for f in fills:
            assert f.result(timeout=120) == 200
    # The interactive request arrived last but was admitted into the first slot that freed.
    assert urgent_first < min(batch_firsts)
