"""A small client of Prometheus' HTTP API (`/api/v1/query`, `/api/v1/query_range`), urllib only.

Any failure to reach Prometheus or an error answer becomes `OpsError` (one line, exit 2).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from apps.core.errors import InvalidRequest

MAX_POINTS = 10_000
Labels = dict[str, str]
Samples = list[tuple[float, float]]


class OpsError(InvalidRequest):
    """Bad input or an unreachable dependency of an ops job: one line on stderr, exit 2."""

    code = "ops_error"


@dataclass(frozen=True)
class Prometheus:
    url: str
    timeout_s: float = 30.0

    def _get(self, path: str, params: dict[str, str]) -> Any:
        query = urllib.parse.urlencode(params)
        target = f"{self.url.rstrip('/')}{path}?{query}"
        if not target.startswith(("http://", "https://")):
            raise OpsError(f"--prometheus-url must be http(s)://, got {self.url!r}", param="prometheus_url")
        try:
            with urllib.request.urlopen(target, timeout=self.timeout_s) as resp:  # noqa: S310 - http(s) checked
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            raise OpsError(f"Prometheus at {self.url} refused the query: {detail}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise OpsError(f"Prometheus not reachable at {self.url}: {exc}", param="prometheus_url") from None
        if body.get("status") != "success":
            raise OpsError(f"Prometheus error: {body.get('error', body)}")
        return body["data"]

    def instant(self, expr: str, at: float) -> list[tuple[Labels, float]]:
        data = self._get("/api/v1/query", {"query": expr, "time": f"{at:.3f}"})
        if data["resultType"] == "scalar":
            return [({}, float(data["result"][1]))]
        return [(r["metric"], float(r["value"][1])) for r in data["result"]]

    def raw(self, selector: str, start: float, end: float) -> list[tuple[Labels, Samples]]:
        """Every stored sample of `selector` in (start, end] (a range-vector instant query)."""
        seconds = max(1, int(end - start + 0.999))
        data = self._get("/api/v1/query", {"query": f"{selector}[{seconds}s]", "time": f"{end:.3f}"})
        return [(r["metric"], [(float(t), float(v)) for t, v in r["values"]]) for r in data["result"]]

    def series_range(
        self, expr: str, start: float, end: float, step_s: float
    ) -> list[tuple[Labels, Samples]]:
        """`query_range` in pieces of at most `MAX_POINTS` steps (Prometheus' limit is 11,000)."""
        merged: dict[tuple[tuple[str, str], ...], tuple[Labels, Samples]] = {}
        lo = start
        while lo <= end:
            hi = min(end, lo + step_s * (MAX_POINTS - 1))
            params = {"query": expr, "start": f"{lo:.3f}", "end": f"{hi:.3f}", "step": f"{step_s:g}"}
            for r in self._get("/api/v1/query_range", params)["result"]:
                key = tuple(sorted(r["metric"].items()))
                samples = merged.setdefault(key, (r["metric"], []))[1]
                samples.extend((float(t), float(v)) for t, v in r["values"])
            lo = hi + step_s
        return list(merged.values())
