"""The observability stage's platform: a loaded local platform scraped by a real Prometheus.

One run per test module: the whole platform (two orchestrators, the `llmfleet dev` fleet of four
engines with agents, a gateway) on real PostgreSQL and Redis, `LocalPrometheus` (the class behind
`llmfleet dev --prometheus`) with the stack's rules, and a load from `loadgen`: 8B streams for the
latency cross-check, 32B and 70B streams, abandoned 8B streams (client disconnects), and the 70B
engine SIGKILLed mid-stream then started again (its agent too; Prometheus reloads its targets); then
response cache hits and misses (`cache_traffic.py`).

Cluster-only exporters (DCGM, Karpenter, kube-state-metrics) cannot run here: `cluster_page()`
serves a static stand-in with their real metric and label names so that the cost rules and
panels have series to evaluate; nothing about llmfleet's own numbers comes from it.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import signal
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from apps.cli.platform import MODEL_8B, MODEL_32B, MODEL_70B, LocalPlatform
from apps.cli.prometheus import LocalPrometheus
from apps.loadgen.config import LoadConfig
from apps.loadgen.report import LoadReport
from apps.loadgen.runner import run_load

if TYPE_CHECKING:
    from tests.observability.cache_traffic import CacheTraffic

LOAD_S = 40.0
MAX_STREAMS = 20  # the demo key's; the steady runs hold 18 streams


def cluster_page() -> str:
    lines = [
        'DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-a",Hostname="ip-10-0-1-5",modelName="NVIDIA L40S"} 0.65',
        'DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="1",UUID="GPU-b",Hostname="ip-10-0-1-5",modelName="NVIDIA L40S"} 0.1',
        'karpenter_nodepools_usage{nodepool="gpu-on-demand",resource_type="nvidia.com/gpu"} 6',
        'karpenter_nodepools_limit{nodepool="gpu-on-demand",resource_type="nvidia.com/gpu"} 16',
        'kube_deployment_status_replicas{namespace="llmfleet",deployment="vllm-llama-3-3-70b-instruct-fp8"} 1',
        'kube_job_status_failed{namespace="llmfleet",job_name="ledger-drift-29420000"} 0',
    ]
    return "\n".join(lines) + "\n"


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = cluster_page().encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


def serve_cluster_page() -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def query(prom_url: str, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    params = {"query": expr, **({"time": f"{at:.3f}"} if at else {})}
    url = f"{prom_url}/api/v1/query?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=30) as resp:
        body = json.loads(resp.read())
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


@dataclass
class Stage:
    platform: LocalPlatform
    prometheus: LocalPrometheus
    database_url: str
    started: float
    ended: float
    reports: dict[str, LoadReport]
    steady_at: float  # the steady runs are in Prometheus, the burst has not started
    cache: CacheTraffic  # the response cache's hits and misses after the load (the demo team, 8B)

    @property
    def url(self) -> str:
        return self.prometheus.url


def _config(platform: LocalPlatform, model: str, **kw: Any) -> LoadConfig:
    assert platform.credentials is not None
    base = {"prompt_tokens": 256, "max_tokens": 64, "request_timeout_s": 60.0}
    return LoadConfig(
        base_url=platform.gateway_url + "/v1",
        api_key=platform.credentials.api_key,
        model=model,
        **{**base, **kw},
    )


async def _kill_and_restart_70b(platform: LocalPlatform, prom: LocalPrometheus, after_s: float) -> None:
    await asyncio.sleep(after_s)  # a point in the load, not a wait for a condition
    node = next(n for n, e in platform.engines.items() if e.spec.model == MODEL_70B)
    engine = platform.engines[node]
    os.killpg(engine.child.pid, signal.SIGKILL)
    await asyncio.to_thread(engine.child.popen.wait, 10)
    await asyncio.to_thread(platform.stop_child, platform.agents[node])
    platform.supervisor.children.remove(engine.child)
    new = platform.start_engine(engine.spec)
    await asyncio.to_thread(platform.supervisor.wait_http_ok, new.child, new.url + "/health", 60)
    platform.start_agent(node)
    await asyncio.to_thread(platform.wait_nodes_ready, [node], 60)
    await asyncio.to_thread(prom.reload)


async def load(platform: LocalPlatform, prom: LocalPrometheus) -> tuple[dict[str, LoadReport], float]:
    runs = {
        "8b": _config(platform, MODEL_8B, concurrency=12, duration_s=LOAD_S, ramp_s=2.0, max_tokens=128),
        "32b": _config(platform, MODEL_32B, concurrency=2, duration_s=LOAD_S, max_tokens=128),
        "70b": _config(platform, MODEL_70B, concurrency=1, duration_s=LOAD_S, max_tokens=128),
        "abandon": _config(platform, MODEL_8B, concurrency=3, requests=30, max_tokens=200, abandon_after=5),
    }
    tasks = {name: asyncio.ensure_future(run_load(cfg)) for name, cfg in runs.items()}
    await _kill_and_restart_70b(platform, prom, LOAD_S / 3)
    reports = {name: await task for name, task in tasks.items()}
    # The steady runs' end, once Prometheus holds the gateway's last TTFT observation of them: the
    # latency cross-check reads the histogram at this instant (one population, not the burst's).
    steady_at = await asyncio.to_thread(wait_gateway_scraped, prom.url, platform)
    # Then past the key's max_streams: 429s (the refusal rules and panels need some).
    reports["burst"] = await run_load(
        _config(platform, MODEL_8B, concurrency=MAX_STREAMS + 6, requests=MAX_STREAMS + 6, max_tokens=16)
    )
    return reports, steady_at


TTFT_COUNT = f'sum(llmfleet_gateway_ttft_seconds_count{{model="{MODEL_8B}"}})'


def wait_gateway_scraped(prom_url: str, platform: LocalPlatform, timeout_s: float = 30.0) -> float:
    """Until Prometheus' count of 8B TTFT observations equals the gateway's own; the time it did."""
    from tests.chaos.helpers import http_text, metric_sum

    deadline = time.monotonic() + timeout_s
    while True:
        direct = metric_sum(
            http_text(platform.gateway_url + "/metrics"),
            "llmfleet_gateway_ttft_seconds_count",
            model=MODEL_8B,
        )
        now = time.time()
        seen = query(prom_url, TTFT_COUNT, now)
        if seen and float(seen[0]["value"][1]) == direct:
            return now
        assert time.monotonic() < deadline, f"Prometheus has {seen} TTFT observations, the gateway {direct}"
        time.sleep(0.5)


def wait_scraped(stage_url: str, platform: LocalPlatform, timeout_s: float = 30.0) -> None:
    """Until Prometheus holds every live engine's final token count (the load has ended)."""
    from tests.chaos.helpers import http_text, metric_sum

    deadline = time.monotonic() + timeout_s
    while True:
        direct = sum(
            metric_sum(http_text(e.url + "/metrics"), "vllm:generation_tokens_total")
            for e in platform.engines.values()
        )
        seen = sum(float(r["value"][1]) for r in query(stage_url, "vllm:generation_tokens_total"))
        if seen == direct:
            return
        assert time.monotonic() < deadline, f"Prometheus has {seen} tokens, the live engines {direct}"
        time.sleep(0.5)
