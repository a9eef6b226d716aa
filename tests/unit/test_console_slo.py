"""The admin view's SLO status against a stand-in Prometheus HTTP API (canned answers), and the
rule names it reads against the PrometheusRule's recording rules."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from apps.core.sizing.plan import plan_fleet
from apps.core.spec import load_spec
from apps.gateway.slo import PrometheusSlo, indicators
from infra.config import OfficeHours
from infra.manifests.alerts import recording_rules
from tests.fakes.web_server import serve_app

SPEC = load_spec("dev")
M8 = "llama-3.1-8b-instruct"


def vector(*samples: tuple[dict[str, str], str]) -> dict[str, Any]:
    return {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"metric": m, "value": [1.0, v]} for m, v in samples]},
    }


ANSWERS = {
    "llmfleet:ttft_seconds:p50": vector(({"model": M8}, "0.4")),
    "llmfleet:ttft_seconds:p95": vector(({"model": M8}, "3.5")),
    "llmfleet:stream_tokens_per_second:p05": vector(({"model": M8}, "NaN")),
    "llmfleet:queue_wait_seconds:p95": vector(),
    "llmfleet:slo_attainment:ratio1h": vector(({"team": "demo", "model": M8}, "0.97")),
}


def prometheus(hold: asyncio.Event | None = None) -> web.Application:
    async def query(request: web.Request) -> web.Response:
        if hold is not None:
            await hold.wait()  # a Prometheus that does not answer until the test lets it
        return web.json_response(ANSWERS[request.query["query"]])

    async def alerts(_: web.Request) -> web.Response:
        return web.json_response(
            {
                "status": "success",
                "data": {
                    "alerts": [
                        {"labels": {"alertname": "LlmfleetTtftP95High", "severity": "critical", "model": M8},
                         "annotations": {"summary": "p95 high"}, "state": "firing"},
                        {"labels": {"alertname": "Pending"}, "annotations": {}, "state": "pending"},
                    ]
                },
            }
        )  # fmt: skip

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    app.router.add_get("/api/v1/alerts", alerts)
    return app


def test_every_rule_the_console_reads_is_a_recording_rule_of_the_stack() -> None:
    records = {r["record"] for r in recording_rules(SPEC, plan_fleet(SPEC), OfficeHours())}
    per_model, attainment = indicators(SPEC)
    assert {i.record for i in [*per_model, attainment]} <= records


async def test_readings_are_compared_with_the_stacks_targets() -> None:
    async with serve_app(prometheus()) as url:
        slo = PrometheusSlo(url, SPEC)
        try:
            status = await slo.status()
        finally:
            await slo.aclose()
    assert status.error is None
    got = {r.indicator.title: (r.value, r.met) for r in status.models}
    assert got == {
        "TTFT p50": (0.4, True),
        "TTFT p95": (3.5, False),  # the dev stack's target is 3 s
        "tokens/s per stream, p05": (None, None),  # NaN: no stream in the window
    }
    assert [(r.labels["team"], r.value, r.met) for r in status.teams] == [("demo", 0.97, True)]
    assert status.alerts == [
        {"alertname": "LlmfleetTtftP95High", "severity": "critical", "model": M8, "summary": "p95 high"}
    ]


async def test_a_slow_or_absent_prometheus_is_a_message_not_an_error() -> None:
    hold = asyncio.Event()
    async with serve_app(prometheus(hold)) as url:
        slo = PrometheusSlo(url, SPEC, timeout_s=0.2)
        try:
            slow = await slo.status()
        finally:
            hold.set()
            await slo.aclose()
    assert slow.error is not None
    assert "timed out" in slow.error
    absent = PrometheusSlo("http://127.0.0.1:9", SPEC, timeout_s=0.5)
    try:
        down = await absent.status()
    finally:
        await absent.aclose()
    assert down.error is not None
    assert "did not answer" in down.error
    assert down.models == []
    assert down.alerts == []
