"""Ledger drift: settled completion tokens in the ledger vs `vllm:generation_tokens` in Prometheus.

The ledger side leaves out the response cache's hits (`usage_ledger.cache = 'hit'`): they are billed
tokens no engine generated (the answer was replayed by the gateway), so counting them would be drift
of exactly the cache's hits.

The Prometheus side is the exact increase of every replica's counter over the window, computed
from the stored samples (not `increase()`, which extrapolates to the window's edges): the last
sample at or before the start is the baseline (0 for a replica that started inside the window:
vLLM creates its counters at 0), a drop is a restart from 0. Tokens an engine produced after
its last scrape before dying are invisible to Prometheus by construction.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import psycopg

from apps.ops.promapi import OpsError, Prometheus, Samples

GENERATION_TOKENS = "vllm:generation_tokens_total"
LOOKBACK_S = 600  # a baseline sample this far before the window (several scrape intervals)


def counter_increase(samples: Samples, start: float, end: float) -> float:
    before = [v for t, v in samples if t <= start]
    inside = [v for t, v in samples if start < t <= end]
    previous = before[-1] if before else 0.0
    total = 0.0
    for value in inside:
        total += value - previous if value >= previous else value  # a reset restarts from 0
        previous = value
    return total


@dataclass(frozen=True)
class Drift:
    start: dt.datetime
    end: dt.datetime
    ledger_tokens: int
    ledger_requests: int
    engine_tokens: float
    replicas: int

    @property
    def ratio(self) -> float:
        if self.engine_tokens == 0:
            return 0.0 if self.ledger_tokens == 0 else 1.0
        return abs(self.ledger_tokens - self.engine_tokens) / self.engine_tokens


def engine_tokens(
    prom: Prometheus, start: dt.datetime, end: dt.datetime, model: str | None
) -> tuple[float, int]:
    selector = GENERATION_TOKENS + (f'{{model_name="{model}"}}' if model else "")
    lo, hi = start.timestamp(), end.timestamp()
    series = prom.raw(selector, lo - LOOKBACK_S, hi)
    return sum(counter_increase(samples, lo, hi) for _, samples in series), len(series)


def ledger_tokens(
    database_url: str, start: dt.datetime, end: dt.datetime, model: str | None
) -> tuple[int, int]:
    sql = (
        "SELECT COALESCE(SUM(completion_tokens), 0), count(*) FROM usage_ledger"
        " WHERE status = 'settled' AND finalized_at >= %s AND finalized_at < %s"
        " AND cache IS DISTINCT FROM 'hit'"  # replayed by the gateway: no engine generated them
    )
    params: list[object] = [start, end]
    if model:
        sql += " AND model = %s"
        params.append(model)
    try:
        with psycopg.connect(database_url, connect_timeout=10) as conn:
            row = conn.execute(sql, params).fetchone()
    except psycopg.Error as exc:
        raise OpsError(
            f"ledger database not reachable: {str(exc).splitlines()[0]}", param="database_url"
        ) from None
    assert row is not None
    return int(row[0]), int(row[1])


def measure(
    prom: Prometheus, database_url: str, start: dt.datetime, end: dt.datetime, model: str | None
) -> Drift:
    engine, replicas = engine_tokens(prom, start, end, model)
    ledger, requests = ledger_tokens(database_url, start, end, model)
    if replicas == 0 and requests == 0:
        raise OpsError(
            f"empty window: no settled request and no {GENERATION_TOKENS} sample between"
            f" {start.isoformat()} and {end.isoformat()}",
            param="from",
        )
    return Drift(start, end, ledger, requests, engine, replicas)


def push(drift: Drift, gateway: str) -> None:
    """Export the result to a Pushgateway (the alert `LlmfleetLedgerDriftHigh` reads it)."""
    from prometheus_client import CollectorRegistry, Gauge, push_to_gateway

    registry = CollectorRegistry()
    Gauge("llmfleet_ledger_drift_ratio", "Ledger vs engine token drift", registry=registry).set(drift.ratio)
    Gauge("llmfleet_ledger_drift_ledger_tokens", "Settled completion tokens", registry=registry).set(
        drift.ledger_tokens
    )
    Gauge("llmfleet_ledger_drift_engine_tokens", "vllm:generation_tokens increase", registry=registry).set(
        drift.engine_tokens
    )
    Gauge("llmfleet_ledger_drift_window_end_seconds", "End of the checked window", registry=registry).set(
        drift.end.timestamp()
    )
    try:
        push_to_gateway(gateway, job="llmfleet-ledger-drift", registry=registry, timeout=10)
    except OSError as exc:
        raise OpsError(f"Pushgateway not reachable at {gateway}: {exc}", param="push_gateway") from None
