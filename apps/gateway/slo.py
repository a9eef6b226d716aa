"""SLO status for the admin view, read from Prometheus (when `LLMFLEET_PROMETHEUS_URL` is set).

The numbers are the PrometheusRule's own recording rules (`infra/manifests/alerts.py`; a test
checks every name used here is one of them), compared with the stack's targets (`spec.slo`,
`spec.alerting.slo_attainment_min`), plus the alerts Prometheus has firing. One bounded
round of concurrent queries per page view; an unreachable Prometheus is a line on the page,
never an error page.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp

from apps.core.spec import StackSpec

Direction = Literal["max", "min"]  # the value must stay at most / at least the target


@dataclass(frozen=True)
class Indicator:
    title: str
    record: str  # the recording rule
    target: float
    direction: Direction
    unit: str


@dataclass(frozen=True)
class Reading:
    indicator: Indicator
    labels: dict[str, str]
    value: float | None  # None: Prometheus has no (finite) value yet

    @property
    def met(self) -> bool | None:
        if self.value is None:
            return None
        i = self.indicator
        return self.value <= i.target if i.direction == "max" else self.value >= i.target


@dataclass(frozen=True)
class SloStatus:
    models: list[Reading] = field(default_factory=list)  # per model and indicator
    teams: list[Reading] = field(default_factory=list)  # SLO attainment per team and model
    alerts: list[dict[str, str]] = field(default_factory=list)  # firing: alertname, severity, model
    error: str | None = None  # Prometheus not configured or not answering


def indicators(spec: StackSpec) -> tuple[list[Indicator], Indicator]:
    slo = spec.slo
    per_model = [
        Indicator("TTFT p50", "llmfleet:ttft_seconds:p50", slo.ttft_p50_s, "max", "s"),
        Indicator("TTFT p95", "llmfleet:ttft_seconds:p95", slo.ttft_p95_s, "max", "s"),
        Indicator(
            "tokens/s per stream, p05", "llmfleet:stream_tokens_per_second:p05",
            slo.tokens_per_s_per_stream, "min", "tokens/s",
        ),
        Indicator("queue wait p95", "llmfleet:queue_wait_seconds:p95", slo.queue_wait_p95_s, "max", "s"),
    ]  # fmt: skip
    attainment = Indicator(
        "SLO attainment (1 h)", "llmfleet:slo_attainment:ratio1h", spec.alerting.slo_attainment_min, "min", ""
    )
    return per_model, attainment


def _value(sample: dict[str, Any]) -> float | None:
    try:
        value = float(sample["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return value if value == value and abs(value) != float("inf") else None  # NaN: no requests


class PrometheusSlo:
    """`status()` for the admin page; `session` is shared with the gateway's lifetime (closed by it)."""

    def __init__(self, url: str, spec: StackSpec, timeout_s: float = 1.0) -> None:
        self._url = url.rstrip("/")
        self._per_model, self._attainment = indicators(spec)
        self._timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _get(self, path: str, params: dict[str, str] | None = None) -> Any:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        async with self._session.get(self._url + path, params=params) as resp:
            body = await resp.json(content_type=None)
        if not isinstance(body, dict) or body.get("status") != "success":
            raise ValueError(f"Prometheus answered {resp.status}")
        return body["data"]

    async def _readings(self, indicator: Indicator) -> list[Reading]:
        data = await self._get("/api/v1/query", {"query": indicator.record})
        return [
            Reading(indicator, dict(sample.get("metric", {})), _value(sample))
            for sample in data.get("result", [])
        ]

    async def status(self) -> SloStatus:
        try:
            async with asyncio.timeout(self._timeout_s):
                *models, teams, alerts = await asyncio.gather(
                    *(self._readings(i) for i in self._per_model),
                    self._readings(self._attainment),
                    self._get("/api/v1/alerts"),
                )
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            reason = "timed out" if isinstance(exc, TimeoutError) else type(exc).__name__
            return SloStatus(error=f"Prometheus at {self._url} did not answer ({reason}).")
        firing = [
            {
                "alertname": str(a.get("labels", {}).get("alertname", "")),
                "severity": str(a.get("labels", {}).get("severity", "")),
                "model": str(a.get("labels", {}).get("model", "")),
                "summary": str(a.get("annotations", {}).get("summary", "")),
            }
            for a in alerts.get("alerts", [])
            if a.get("state") == "firing"
        ]
        flat = [r for readings in models for r in readings]
        flat.sort(key=lambda r: (r.labels.get("model", ""), r.indicator.title))
        teams.sort(key=lambda r: (r.labels.get("team", ""), r.labels.get("model", "")))
        return SloStatus(models=flat, teams=teams, alerts=firing)
