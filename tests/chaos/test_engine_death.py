"""Chaos 2: an engine dies mid-stream (enginesim fault injection: the connection drops).

- after chunks reached the client, on every engine: the stream is resumed once on another node
  (tests/chaos/test_resume.py covers the resume itself), that node's engine dies too, and the
  client gets an error event and `[DONE]` (no hang, no second resume); the ledger settles
  exactly the tokens the client received;
- before any chunk: the request is retried once on another node and succeeds.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from apps.cli.platform import MODEL_8B, LocalPlatform
from tests.chaos.conftest import PlatformFactory
from tests.chaos.helpers import http_post_json, http_text, metric_sum, settled_rows, wait_until

pytestmark = pytest.mark.chaos


def _stream(platform: LocalPlatform, max_tokens: int) -> tuple[list[bytes], float]:
    """One streamed request through the gateway: the SSE payloads and the wall time it took."""
    assert platform.credentials is not None
    body = {
        "model": MODEL_8B,
        "messages": [{"role": "user", "content": "tell me a story"}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    payloads: list[bytes] = []
    t0 = time.monotonic()
    with httpx.stream(
        "POST",
        platform.gateway_url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {platform.credentials.api_key}"},
        timeout=60,
    ) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: "):
                payloads.append(line[6:].encode())
    return payloads, time.monotonic() - t0


def test_engine_dying_mid_stream_gives_an_error_event_and_settles_the_partial_tokens(
    make_platform: PlatformFactory, migrated_db_url: str
) -> None:
    platform = make_platform()
    for engine in platform.engines.values():  # whichever node gets it, its engine dies after 3 tokens
        status, _ = http_post_json(engine.url + "/_sim/faults", {"die_after_tokens": 3})
        assert status == 200
    payloads, elapsed = _stream(platform, max_tokens=50)
    content = [p for p in payloads if b'"content"' in p and b'"role"' not in p]
    errors = [p for p in payloads if p.startswith(b'{"error"')]
    assert len(content) == 6  # three on the first node, three on the one it resumed on
    assert len([p for p in payloads if b'"role"' in p]) == 1
    assert len(errors) == 1, payloads
    failed = sum(
        metric_sum(
            http_text(platform.orchestrator_url(i) + "/metrics"),
            "llmfleet_orchestrator_resumes_total",
            outcome="failed",
        )
        for i in range(len(platform.orchestrators))
    )
    assert failed == 1
    assert json.loads(errors[0])["error"]["message"]
    assert payloads[-1] == b"[DONE]"
    assert elapsed < 30  # ended by the failure, not by a client-side timeout
    rows = wait_until(lambda: settled_rows(migrated_db_url), 20, "the partial stream settled")
    assert len(rows) == 1
    assert rows[0][2] == 6  # the six tokens the client received, billed
    assert rows[0][1] > 0  # prompt tokens from the engine's /tokenize


def test_engine_dying_before_the_first_chunk_is_retried_once_on_another_node(
    make_platform: PlatformFactory, migrated_db_url: str
) -> None:
    platform = make_platform()
    # The on-premises node is filled first, so every request tries it first; its engine
    # drops every stream right after the response headers (no chunk was produced).
    onprem = next(e for e in platform.engines.values() if e.spec.location == "onprem")
    http_post_json(onprem.url + "/_sim/faults", {"die_after_tokens": 0})
    for _ in range(4):
        payloads, _ = _stream(platform, max_tokens=5)
        assert not any(p.startswith(b'{"error"') for p in payloads), payloads
        assert len([p for p in payloads if b'"content"' in p and b'"role"' not in p]) == 5
    retries = sum(
        metric_sum(
            http_text(platform.orchestrator_url(i) + "/metrics"), "llmfleet_orchestrator_retries_total"
        )
        for i in range(len(platform.orchestrators))
    )
    assert retries >= 1
    rows = wait_until(lambda: len(r := settled_rows(migrated_db_url)) == 4 and r, 20, "four settles")
    assert sorted(r[2] for r in rows) == [5, 5, 5, 5]  # billed once each, for the retried run
