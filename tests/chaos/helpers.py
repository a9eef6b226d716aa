"""Observation helpers for the chaos suite: ledger totals, engine and orchestrator metrics,
polling with a deadline (never a sleep to wait for something), and the requests the tests send
through the platform's gateway (a load run, one streamed story)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import psycopg

from apps.cli.platform import MODEL_8B, LocalPlatform
from apps.loadgen.config import LoadConfig

T = TypeVar("T")


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str, every_s: float = 0.1) -> Any:
    """Poll until `predicate()` is truthy; returns that value (tests chain `cond and value`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(every_s)


def story_body(max_tokens: int, **extra: object) -> dict[str, object]:
    """A streamed chat request to the 8B model that runs exactly `max_tokens` tokens."""
    return {
        "model": MODEL_8B,
        "messages": [{"role": "user", "content": "tell me a long story"}],
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
        **extra,
    }


def load_8b(platform: LocalPlatform, **shape: int) -> LoadConfig:
    """Load on the 8B model through the gateway; `shape` is concurrency, requests and token counts."""
    assert platform.credentials is not None
    return LoadConfig(
        base_url=platform.gateway_url + "/v1",
        api_key=platform.credentials.api_key,
        model=MODEL_8B,
        request_timeout_s=120,
        **shape,
    )


@contextlib.contextmanager
def story_stream(platform: LocalPlatform, max_tokens: int) -> Iterator[httpx.Response]:
    """`story_body(max_tokens)` streamed through the gateway with the demo key; asserts the 200."""
    assert platform.credentials is not None
    with httpx.stream(
        "POST",
        platform.gateway_url + "/v1/chat/completions",
        json=story_body(max_tokens),
        headers={"Authorization": f"Bearer {platform.credentials.api_key}"},
        timeout=90,
    ) as resp:
        assert resp.status_code == 200, resp.read()
        yield resp


def redial_agents(
    platform: LocalPlatform, port: int, node_ids: list[str], ready: list[str] | None = None
) -> None:
    """Restart the agents of `node_ids` dialling 127.0.0.1:`port` (a proxy in front of an
    orchestrator) and wait until the nodes `ready` (default: those) are ready again."""
    for node_id in node_ids:
        platform.stop_child(platform.agents[node_id])
        platform.start_agent(node_id, f"ws://127.0.0.1:{port}/v1/nodes/connect")
    platform.wait_nodes_ready(node_ids if ready is None else ready, 60)


def running_streams(
    pool: ThreadPoolExecutor,
    stream: Callable[[LocalPlatform, threading.Event], T],
    platform: LocalPlatform,
    n: int,
    before: str,
) -> list[Future[T]]:
    """`n` calls of `stream(platform, started)` on `pool`, returned once each has set its `started`
    (its first token arrived) and none has ended yet (all still run at `before`, the fault)."""
    started = [threading.Event() for _ in range(n)]
    futures = [pool.submit(stream, platform, ev) for ev in started]
    for ev in started:
        assert ev.wait(60), "a stream did not start"
    assert not any(f.done() for f in futures), f"a stream ended before the {before}: make them longer"
    return futures


def content_events(payloads: list[str]) -> int:
    """The content events among an SSE stream's `data:` payloads (enginesim: one per token; the
    role chunk carries none)."""
    return sum(1 for p in payloads if '"content":"' in p and '"role"' not in p)


def http_text(url: str, timeout_s: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        body: bytes = resp.read()
        return body.decode()


def http_post_json(
    url: str, body: dict[str, Any], token: str = "", timeout_s: float = 5.0
) -> tuple[int, Any]:
    return http_json(url, "POST", body, token, timeout_s)


def http_json(
    url: str, method: str, body: Any = None, token: str = "", timeout_s: float = 5.0
) -> tuple[int, Any]:
    """(status, JSON answer) of a request with a JSON body (None: none), e.g. to the admin API."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return resp.status, json.loads(resp.read() or b"null")


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of a Prometheus family's samples whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, label_text = head.partition("{")
        if metric != name:
            continue
        if all(f'{k}="{v}"' in label_text for k, v in labels.items()):
            total += float(value)
    return total


def engine_running(engine_url: str) -> float:
    """Requests the engine runs now."""
    return metric_sum(http_text(engine_url + "/metrics"), "vllm:num_requests_running")


def engines_running(platform: LocalPlatform) -> float:
    """Requests every engine of the platform runs now, summed."""
    return sum(engine_running(engine.url) for engine in platform.engines.values())


def engine_admitted(engine_url: str) -> float:
    """Requests the engine has admitted (finished + running + waiting)."""
    text = http_text(engine_url + "/metrics")
    return sum(
        metric_sum(text, name)
        for name in ("vllm:request_success_total", "vllm:num_requests_running", "vllm:num_requests_waiting")
    )


def orchestrators_metric(platform: LocalPlatform, name: str, **labels: str) -> float:
    """`metric_sum` of one family over every orchestrator replica of the platform."""
    return sum(
        metric_sum(http_text(platform.orchestrator_url(i) + "/metrics"), name, **labels)
        for i in range(len(platform.orchestrators))
    )


@dataclass(frozen=True)
class LedgerTotals:
    settled: int
    reserved: int
    cancelled: int
    prompt_tokens: int
    completion_tokens: int
    cost: int


def ledger_totals(db_url: str) -> LedgerTotals:
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'settled'), count(*) FILTER (WHERE status = 'reserved'), "
            "count(*) FILTER (WHERE status = 'cancelled'), "
            "COALESCE(SUM(prompt_tokens) FILTER (WHERE status = 'settled'), 0), "
            "COALESCE(SUM(completion_tokens) FILTER (WHERE status = 'settled'), 0), "
            "COALESCE(SUM(cost_microcredits) FILTER (WHERE status = 'settled'), 0) FROM usage_ledger"
        ).fetchone()
    assert row is not None
    return LedgerTotals(*(int(v) for v in row))


def balance_consistent(db_url: str) -> tuple[int, int]:
    """(balance, credits - settled cost) of every team, summed: equal when nothing was double-debited."""
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT (SELECT COALESCE(SUM(balance_microcredits), 0) FROM teams), "
            "(SELECT COALESCE(SUM(amount_microcredits), 0) FROM credit_entries) - "
            "(SELECT COALESCE(SUM(cost_microcredits), 0) FROM usage_ledger WHERE status = 'settled')"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def settled_rows(db_url: str) -> list[tuple[str, int, int]]:
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "SELECT request_id, prompt_tokens, completion_tokens FROM usage_ledger WHERE status = 'settled'"
        ).fetchall()
    return [(str(r[0]), int(r[1]), int(r[2])) for r in rows]
