"""The observability stage's response cache traffic (the dashboards' cache panels read it).

After the load, the demo team's cache is turned on for the 8B model through the admin API and the demo
key asks questions at temperature 0 in three rounds: new questions (misses), then the same again (exact
hits) with new ones (misses), then all of them again (hits). Before each next round Prometheus must hold
the gateway's own counts, so every series the panels read (requests by result, GPU time saved, lookup
latency) grows between two of its samples: `rate()` sees an increase, not only a series that appeared
with its final value. The embedding model cannot be asked for a semantic match here (the test
PostgreSQL has no pgvector), so only the exact match's series exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import openai

from apps.cli.platform import DEMO_TEAM, MODEL_8B, LocalPlatform
from tests.chaos.helpers import http_json, http_text, metric_sum, wait_until
from tests.observability.stage import query

CACHE_REQUESTS = "llmfleet_gateway_cache_requests_total"
QUESTIONS = [f"Which prime number comes after {n}?" for n in (10, 20, 30, 40, 50, 60)]


@dataclass(frozen=True)
class CacheTraffic:
    team_id: int
    hits: int
    misses: int


def _admin(platform: LocalPlatform, method: str, path: str, body: Any = None) -> Any:
    return http_json(platform.gateway_url + path, method, body, platform.admin_token, timeout_s=10)[1]


def _ask(client: openai.OpenAI, questions: list[str]) -> list[str]:
    """Each question once; the gateway's `x-llmfleet-cache` of each."""
    seen = []
    for question in questions:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL_8B,
            messages=[{"role": "user", "content": question}],
            max_tokens=16,
            temperature=0,
        )
        seen.append(raw.headers.get("x-llmfleet-cache", ""))
    return seen


def _scraped(platform: LocalPlatform, prom_url: str) -> None:
    """Until Prometheus' cache request counts equal the gateway's own (one gateway worker)."""

    def same() -> bool:
        direct = metric_sum(http_text(platform.gateway_url + "/metrics"), CACHE_REQUESTS)
        seen = query(prom_url, f"sum({CACHE_REQUESTS})")
        return bool(seen) and float(seen[0]["value"][1]) == direct

    wait_until(same, 30, "Prometheus to hold the gateway's cache counts", every_s=0.25)


def cache_traffic(platform: LocalPlatform, prom_url: str) -> CacheTraffic:
    assert platform.credentials is not None
    teams = _admin(platform, "GET", "/admin/teams")["data"]
    team_id = next(int(t["id"]) for t in teams if t["name"] == DEMO_TEAM)
    _admin(platform, "PUT", f"/admin/teams/{team_id}/cache", {"models": {MODEL_8B: {}}})

    def stored(entries: int) -> None:
        def enough() -> bool:
            return int(_admin(platform, "GET", f"/admin/teams/{team_id}/cache/stats")["entries"]) >= entries

        wait_until(enough, 30, f"{entries} answers stored in the cache", every_s=0.25)

    first, later = QUESTIONS[:4], QUESTIONS[4:]
    with openai.OpenAI(
        base_url=platform.gateway_url + "/v1", api_key=platform.credentials.api_key, max_retries=0, timeout=60
    ) as client:
        assert _ask(client, first) == ["miss"] * 4
        stored(4)
        _scraped(platform, prom_url)
        assert _ask(client, first + later) == ["hit"] * 4 + ["miss"] * 2
        stored(6)
        _scraped(platform, prom_url)
        assert _ask(client, first + later) == ["hit"] * 6
        _scraped(platform, prom_url)
    return CacheTraffic(team_id, hits=10, misses=6)
