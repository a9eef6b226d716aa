"""`/health`, `/version`, `/v1/models`, `/metrics` names and labels, abort and KV-cache behaviour."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest

from tests.conformance.conftest import EngineUnderTest
from tests.conformance.helpers import chat_body, metric, metric_values, poll_until, stream_chat

REQUIRED_FAMILIES = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:time_to_first_token_seconds_count",
    "vllm:inter_token_latency_seconds_count",
    "vllm:e2e_request_latency_seconds_count",
]


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60.0) as c:
        yield c


def test_health_and_version(engine: EngineUnderTest, client: httpx.Client) -> None:
    resp = client.get(f"{engine.url}/health")
    assert resp.status_code == 200
    assert resp.content == b""
    version = client.get(f"{engine.url}/version").json()["version"]
    assert version.startswith("0.32")


def test_models_card(engine: EngineUnderTest, client: httpx.Client) -> None:
    body = client.get(f"{engine.url}/v1/models").json()
    assert body["object"] == "list"
    card = body["data"][0]
    assert card["id"] == engine.model
    assert card["object"] == "model"
    assert card["owned_by"] == "vllm"
    assert card["max_model_len"] == engine.max_model_len
    assert isinstance(card["root"], str)
    assert card["root"]


def test_metric_families_and_labels(engine: EngineUnderTest, client: httpx.Client) -> None:
    values = metric_values(client, engine.url)
    for name in REQUIRED_FAMILIES:
        metric(values, name, model_name=engine.model, engine="0")
    for reason in ("stop", "length", "abort"):
        metric(
            values, "vllm:request_success_total", model_name=engine.model, engine="0", finished_reason=reason
        )


def test_client_abort_frees_the_request(engine: EngineUnderTest, client: httpx.Client) -> None:
    before = metric_values(client, engine.url)
    body = chat_body(engine.model, max_tokens=1000, ignore_eos=True, stream=True)
    with client.stream("POST", f"{engine.url}/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if '"content":"' in line and '"role"' not in line:
                break  # the first content chunk: disconnect now

    def idle() -> bool:
        return metric(metric_values(client, engine.url), "vllm:num_requests_running") == 0

    poll_until(idle, deadline_s=10)
    after_abort = metric_values(client, engine.url)
    generated = metric(after_abort, "vllm:generation_tokens_total") - metric(
        before, "vllm:generation_tokens_total"
    )
    # Real vLLM behaviour: an abort is not counted as a finished request (abort counter stays).
    assert metric(after_abort, "vllm:request_success_total", finished_reason="abort") == metric(
        before, "vllm:request_success_total", finished_reason="abort"
    )
    if engine.traits.abort_always_beats_completion:
        assert 1 <= generated < 1000

        def finished(v: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> float:
            return sum(metric(v, "vllm:request_success_total", finished_reason=r) for r in ("stop", "length"))

        assert finished(after_abort) == finished(before)
    # Generation has stopped: one more small request adds exactly its own tokens.
    small = client.post(
        f"{engine.url}/v1/chat/completions", json=chat_body(engine.model, max_tokens=3, ignore_eos=True)
    )
    assert small.status_code == 200
    later = metric_values(client, engine.url)
    assert (
        metric(later, "vllm:generation_tokens_total") - metric(after_abort, "vllm:generation_tokens_total")
        == 3
    )


def test_kv_cache_usage_moves_with_load(engine: EngineUnderTest, client: httpx.Client) -> None:
    samples: list[float] = []
    done = threading.Event()

    def load() -> None:
        with httpx.Client(timeout=60.0) as c:
            threads = [
                threading.Thread(
                    target=stream_chat,
                    args=(
                        c,
                        engine.url,
                        chat_body(
                            engine.model, content="hello " * 300, max_tokens=400, ignore_eos=True, stream=True
                        ),
                    ),
                )
                for _ in range(6)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        done.set()

    loader = threading.Thread(target=load)
    loader.start()
    while not done.is_set():
        samples.append(metric(metric_values(client, engine.url), "vllm:kv_cache_usage_perc"))
    loader.join()
    assert all(0.0 <= s <= 1.0 for s in samples)
    if engine.traits.kv_usage_observable_under_load:
        assert max(samples) > 0.0
    idle = poll_until(
        lambda: metric(metric_values(client, engine.url), "vllm:kv_cache_usage_perc") == 0.0, deadline_s=10
    )
    assert idle
