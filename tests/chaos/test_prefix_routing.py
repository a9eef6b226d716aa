"""Prefix-aware picks on the local platform (issue 29 item 3): two 8B enginesim nodes publishing KV
events, their agents forwarding them and announcing prefixes, one orchestrator, the gateway.

A conversation's system prompt runs on node X. X is then made the busier node (one long stream);
the next request with that system prompt still goes to X (its engine's prefix cache hits: the
engine's own `vllm:prefix_cache_hits` moves there), while a request with another system prompt
goes to the idle node Y. Without the prefix, the second request would have gone to Y (least load).
"""

from __future__ import annotations

import threading

import httpx
import pytest
import redis

from apps.cli.platform import LocalPlatform
from apps.core.nodes import keys
from apps.core.scheduling.prefix import prefix_keys, team_scope
from tests.chaos.conftest import PlatformFactory, eight_b_nodes
from tests.chaos.helpers import http_post_json, wait_until

pytestmark = pytest.mark.chaos
SYSTEM = {"role": "system", "content": " ".join(f"rule{i} applies to claims" for i in range(120))}
OTHER = {"role": "system", "content": " ".join(f"note{i} for members" for i in range(120))}


def _engine_counter(platform: LocalPlatform, node_id: str, name: str) -> float:
    text = httpx.get(platform.engines[node_id].url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def _chat(platform: LocalPlatform, messages: list[dict[str, str]], max_tokens: int = 4) -> None:
    assert platform.credentials is not None
    resp = httpx.post(
        platform.gateway_url + "/v1/chat/completions",
        json={"model": "llama-3.1-8b-instruct", "messages": messages, "max_tokens": max_tokens},
        headers={"Authorization": f"Bearer {platform.credentials.api_key}"},
        timeout=60,
    )
    assert resp.status_code == 200, resp.text


def _prompts(platform: LocalPlatform, nodes: list[str]) -> dict[str, float]:
    """Each engine's prompt tokens so far: vLLM counts a request's prompt when its first token comes
    out, so only a request that started since moves it (not one that merely finishes)."""
    return {n: _engine_counter(platform, n, "vllm:prompt_tokens_total") for n in nodes}


def _started_on(platform: LocalPlatform, before: dict[str, float]) -> str:
    """The one node whose engine started a request since `before`."""
    after = _prompts(platform, list(before))
    moved = [n for n in before if after[n] > before[n]]
    assert len(moved) == 1, (before, after)
    return moved[0]


@pytest.mark.timeout(180)
def test_a_known_system_prompt_goes_back_to_its_node_and_a_new_one_to_the_idle_node(
    make_platform: PlatformFactory, redis_url: str
) -> None:
    specs = eight_b_nodes(2, onprem=0)
    nodes = [s.node_id for s in specs]
    platform = make_platform(orchestrators=1, nodes=specs, speed=4.0)
    # 1. The system prompt's first conversation: on X.
    before = _prompts(platform, nodes)
    _chat(platform, [SYSTEM, {"role": "user", "content": "is claim 1 covered?"}])
    x = _started_on(platform, before)
    (y,) = [n for n in nodes if n != x]
    # Its prefixes were announced (the agent asked its engine's tokenizer, the orchestrator checked
    # the blocks against X's KV events): every replica's picker can see them now.
    r = redis.Redis.from_url(redis_url)
    assert platform.demo_team_id is not None
    scope = team_scope(platform.demo_team_id)  # the team's prefix keys: no other team's match them
    announced = keys.prefix_key("llama-3.1-8b-instruct", prefix_keys([SYSTEM], scope=scope)[0])
    wait_until(lambda: r.hget(announced, x) is not None, 30, "the system prompt's announcement")
    assert r.hget(keys.prefix_key("llama-3.1-8b-instruct", prefix_keys([SYSTEM])[0]), x) is None

    # 2. X gets a long stream (both idle: the tie goes to X again, the lower id) and runs ahead. X's
    # engine stalls that one stream's output after a few tokens (a fault for its next request only),
    # so the stream holds X's slot until the test closes it, however fast or slow the machine is.
    assert platform.credentials is not None
    status, _ = http_post_json(
        platform.engines[x].url + "/_sim/faults", {"stall_s": 120, "stall_after_tokens": 3, "times": 1}
    )
    assert status == 200
    long_body = {"model": "llama-3.1-8b-instruct", "messages": [{"role": "user", "content": "a story"}]}
    client = httpx.Client(
        base_url=platform.gateway_url,
        headers={"Authorization": f"Bearer {platform.credentials.api_key}"},
        timeout=httpx.Timeout(10, read=150),
    )
    started = threading.Event()

    def long_stream() -> None:
        try:
            with client.stream("POST", "/v1/chat/completions", json={**long_body, "stream": True}) as resp:
                for _ in resp.iter_lines():
                    started.set()
        except Exception:  # the test closes the client under it
            started.set()

    before = _prompts(platform, nodes)
    thread = threading.Thread(target=long_stream, daemon=True)
    thread.start()
    try:
        assert started.wait(30)
        assert _started_on(platform, before) == x

        # 3. The known system prompt goes back to X (its cache), a new one to the idle Y.
        before, hits = _prompts(platform, nodes), _engine_counter(platform, x, "vllm:prefix_cache_hits_total")
        _chat(platform, [SYSTEM, {"role": "user", "content": "and claim 2?"}])
        assert _started_on(platform, before) == x
        assert _engine_counter(platform, x, "vllm:prefix_cache_hits_total") > hits
        before = _prompts(platform, nodes)
        _chat(platform, [OTHER, {"role": "user", "content": "what is my deductible?"}])
        assert _started_on(platform, before) == y
        metrics = httpx.get(platform.orchestrator_url(0) + "/metrics", timeout=10).text
        assert (
            'llmfleet_orchestrator_prefix_picks_total{model="llama-3.1-8b-instruct",outcome="hit"}' in metrics
        )
    finally:
        client.close()  # ends the stalled stream (the gateway cancels it)
        thread.join(30)
        r.close()
