"""Gateway graceful shutdown (issue 15 section 1): SIGTERM to a real gateway process (one worker,
and a supervisor with two) while streams run through the whole platform.

Every stream in flight completes (all its tokens, `[DONE]`, no error event) and is billed once;
after the SIGTERM the gateway takes no new request (the connection is refused, or a request
that still reached it is answered 503 `shutting_down`); then the process exits by itself.
"""

from __future__ import annotations

import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from apps.cli.platform import LocalPlatform
from tests.chaos.conftest import PlatformFactory, eight_b_nodes
from tests.chaos.helpers import (
    balance_consistent,
    content_events,
    ledger_totals,
    running_streams,
    settled_rows,
    story_body,
    story_stream,
    wait_until,
)

pytestmark = pytest.mark.chaos

STREAMS = 8
MAX_TOKENS = 400  # a few seconds at speed 2: long enough to still run at the SIGTERM


def _stream(platform: LocalPlatform, started: threading.Event) -> list[str]:
    payloads: list[str] = []
    with story_stream(platform, MAX_TOKENS) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: "):
                payloads.append(line[6:])
                if '"content":"' in line and '"role"' not in line:
                    started.set()
    return payloads


def _refused(platform: LocalPlatform) -> str | None:
    """How a new request is turned away now (None: it was admitted)."""
    assert platform.credentials is not None
    try:
        resp = httpx.post(
            platform.gateway_url + "/v1/chat/completions",
            json=story_body(1, stream=False),
            headers={"Authorization": f"Bearer {platform.credentials.api_key}"},
            timeout=10,
        )
    except httpx.ConnectError:
        return "connection refused"
    if resp.status_code == 503 and resp.json()["error"]["code"] == "shutting_down":
        return "503 shutting_down"
    return None


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_lets_every_stream_finish_and_takes_no_new_request(
    make_platform: PlatformFactory, migrated_db_url: str, workers: int
) -> None:
    platform = make_platform(
        orchestrators=1,
        nodes=eight_b_nodes(1),
        speed=2.0,
        gateway_env={
            "LLMFLEET_PG_POOL_MIN": "1",
            "LLMFLEET_PG_POOL_MAX": "8",
            "LLMFLEET_WORKERS": str(workers),
            "LLMFLEET_GRACEFUL_SHUTDOWN_S": "60",
        },
    )
    assert platform.gateway is not None
    gateway = platform.gateway.popen
    with ThreadPoolExecutor(STREAMS) as pool:
        streams = running_streams(pool, _stream, platform, STREAMS, "SIGTERM")
        gateway.send_signal(signal.SIGTERM)
        # The signal is handled asynchronously: from some moment on, nothing new is admitted.
        how = wait_until(lambda: _refused(platform), 15, "new requests to be refused")
        results = [f.result(timeout=90) for f in streams]
    for payloads in results:
        assert payloads[-1] == "[DONE]"
        assert not any(p.startswith('{"error"') for p in payloads), payloads[-3:]
        assert content_events(payloads) == MAX_TOKENS  # enginesim: one chunk per token, every one delivered
    wait_until(lambda: gateway.poll() is not None, 30, "the gateway to exit")
    code = gateway.returncode
    # One worker re-raises SIGTERM after its graceful shutdown (uvicorn); the supervisor exits 0.
    assert code in (0, -signal.SIGTERM), code
    assert _refused(platform) == "connection refused"
    # Every stream's settle (they run on the orchestrator's settle workers after the client's [DONE]).
    rows = wait_until(
        lambda: len(r := [x for x in settled_rows(migrated_db_url) if x[2] == MAX_TOKENS]) >= STREAMS and r,
        20,
        "settles",
    )
    assert len(rows) == STREAMS  # every stream billed, once
    assert (
        ledger_totals(migrated_db_url).reserved == 0
    )  # nothing left open (a probe admitted early settles too)
    balance, expected = balance_consistent(migrated_db_url)
    assert balance == expected
    print(f"\nworkers={workers}: after SIGTERM a new request got: {how}")
