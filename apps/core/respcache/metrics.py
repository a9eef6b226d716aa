"""The response cache's metrics (docs/response-cache.md, docs/observability.md), `team` the team's id:

- `llmfleet_gateway_cache_requests_total{team, model, result}`: each chat or completion request of a team
  whose policy names the model: `exact_hit`, `semantic_hit`, `miss`, `bypass` (not cacheable: `n`,
  temperature, tools...), `error` (the cache could not be asked: the request went on uncached);
- `llmfleet_gateway_cache_saved_gpu_seconds_total{team, model}`: the GPU time the hits did not take, at the
  stack's planning figures (a replica's GPUs over its decode rate, per completion token);
- `llmfleet_gateway_cache_lookup_seconds{model, match, result}`: what a lookup added before the request went
  on (`match`: `exact`; `semantic`, with the question's embedding from the fleet; `result`: `hit` or `miss`:
  a miss's is the time the cache adds to a request the fleet then answers);
- `llmfleet_gateway_cache_writes_total{model, outcome}`: a miss's answer `stored`, `skipped` (incomplete,
  too long, another revision answered) or `error`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

LOOKUP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5)


class CacheMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "llmfleet_gateway_cache_requests",
            "Response cache outcomes by team id, model and result (exact_hit, semantic_hit, miss, bypass, error)",
            ["team", "model", "result"],
            registry=registry,
        )
        self.saved_gpu_seconds = Counter(
            "llmfleet_gateway_cache_saved_gpu_seconds",
            "GPU seconds the response cache's hits did not take (planning figures), by team id and model",
            ["team", "model"],
            registry=registry,
        )
        self.lookup = Histogram(
            "llmfleet_gateway_cache_lookup_seconds",
            "Time a response cache lookup added to a request, by model, match (exact, semantic) and result (hit, miss)",
            ["model", "match", "result"],
            buckets=LOOKUP_BUCKETS,
            registry=registry,
        )
        self.writes = Counter(
            "llmfleet_gateway_cache_writes",
            "Answers written to the response cache by model and outcome (stored, skipped, error)",
            ["model", "outcome"],
            registry=registry,
        )
