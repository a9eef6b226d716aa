"""The response cache on one request (docs/response-cache.md): looked up after the input guardrails and
before admission; a hit is answered by the gateway, a miss goes to the fleet and its answer is stored.

`look` gives the request's `CacheTurn` (None: the team's policy does not name the model, or the cache
could not be asked, which only costs the lookup: the request goes on uncached, counted as `error`). The
scope is the team, the model and the revision that answers (a pinned one, else the model's stable
revision): a new revision never answers from its predecessor's entries. Exact match first; then, where
the team set a threshold for the model, the question (the last user turn) is embedded by the fleet's
embedding model (`apps.gateway.fleet_call`: billed to the team) and matched by cosine similarity.

A hit (`answer`) is admitted like any request (its key's requests per minute, a stream slot while it
replays), takes nothing of the token quotas (no GPU works for it), and is billed at the model's cache
price in one reservation settled at once (`usage_ledger.cache = 'hit'`); its answer streams in the
same SSE shape as a miss's. A miss's answer is captured as it is relayed (`capture`) and stored after the
response finished (`remember`), if it came whole from the revision looked up.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse, Response, StreamingResponse

from apps.core.errors import StoreUnavailable, Unavailable
from apps.core.identity.principal import Principal
from apps.core.protocol.dispatch import MODEL_REVISION_HEADER, DispatchRequest
from apps.core.protocol.openai import SseSplitter, sse_event
from apps.core.respcache.entry import CapturedAnswer
from apps.core.respcache.keys import MatchKeys, bypass_reason, canonical_json, match_keys
from apps.core.respcache.metrics import CacheMetrics
from apps.core.respcache.policies import CachePolicyStore
from apps.core.respcache.policy import CachePolicy
from apps.core.respcache.sealing import TeamKey
from apps.core.respcache.store import CacheStore, Found, Scope
from apps.core.sizing.plan import plan_model
from apps.core.spec import StackSpec
from apps.gateway.deps import GatewayDeps
from apps.gateway.exchange import Exchange
from apps.gateway.fleet_call import FleetCall
from apps.gateway.ports import Upstream, WrappedUpstream
from apps.gateway.settings import GatewaySettings
from apps.gateway.validate import InferenceRequest
from apps.gateway.validate_prompts import validate_embeddings

log = logging.getLogger("llmfleet.gateway.cache")

CACHE_HEADER = "x-llmfleet-cache"
EMBED_SUFFIX = ":cache-embed"  # the question's embedding: the request's id and this, in the ledger
ID_PREFIX = {"chat": "chatcmpl-", "completions": "cmpl-"}
JANITOR_INTERVAL_S = 60.0
EXPIRE_BATCH = 1000


def gpu_seconds_per_token(spec: StackSpec) -> dict[str, float]:
    """Each chat model's GPU seconds per completion token at the planner's figures: a replica's GPUs
    over its decode rate (a model the planner cannot size counts one GPU)."""
    out: dict[str, float] = {}
    for name, model in spec.models.items():
        rate = model.serving.output_tokens_per_s_per_replica
        if model.serving.task != "generate" or not rate:
            continue
        try:
            gpus = plan_model(spec, name, model).gpus_per_replica
        except Exception:  # a test stack the planner cannot size: a figure for a dashboard, never an error
            gpus = 1
        out[name] = gpus / rate
    return out


@dataclass
class CacheTurn:
    """One request's use of the cache."""

    policy: CachePolicy
    scope: Scope
    key: TeamKey
    keys: MatchKeys
    endpoint: str
    threshold: float | None
    vector: list[float] | None = None
    found: Found | None = None
    capture: CapturedAnswer | None = None

    @property
    def embedder(self) -> str | None:
        return self.policy.embedding_model if self.vector is not None else None


class CapturingUpstream(WrappedUpstream):
    """Relays a miss's answer and keeps a copy (`CapturedAnswer`). The fleet is asked for usage (the
    entry's token counts); its usage chunk reaches the client only if the client asked for it."""

    def __init__(self, inner: Upstream, capture: CapturedAnswer, pass_usage: bool) -> None:
        super().__init__(inner)
        self._capture = capture
        self._pass_usage = pass_usage

    async def chunks(self) -> AsyncIterator[bytes]:
        splitter = SseSplitter()
        async for data in self._inner.chunks():
            out = [sse_event(p) for p in splitter.feed(data) if self._capture.add(p) or self._pass_usage]
            if out:
                yield b"".join(out)

    @property
    def blocked(self) -> Any:
        return getattr(self._inner, "blocked", None)  # a screened upstream's block (the guardrails)


class ResponseCaching:
    def __init__(self, settings: GatewaySettings, deps: GatewayDeps) -> None:
        self._spec: StackSpec = deps.spec
        self._policies: CachePolicyStore | None = deps.cache_policies
        self._store: CacheStore | None = deps.cache_store
        self._ledger = deps.ledger
        self._call = FleetCall(settings, deps)
        self.metrics = CacheMetrics(deps.registry)
        self._gpu_s = gpu_seconds_per_token(deps.spec)
        self._writes: set[asyncio.Task[None]] = set()

    async def plan(self, req: InferenceRequest, principal: Principal, ex: Exchange) -> CacheTurn | None:
        """The request's turn when its team's policy names the model and it is cacheable (None: the
        cache is not asked). Cheap: the policy, the team's key and the stable revision are cached."""
        if self._policies is None or self._store is None or principal.team_id is None:
            return None
        try:
            policy = await self._policies.policy(principal.team_id)
            model_cache = policy.models.get(req.model) if policy is not None else None
            if policy is None or model_cache is None:
                return None
            if bypass_reason(req.endpoint, req.body, policy) is not None:
                ex.headers[CACHE_HEADER] = "bypass"
                self.metrics.requests.labels(str(principal.team_id), req.model, "bypass").inc()
                return None
            revision = ex.pinned or await self._store.stable_revision(req.model) or ""
            key = await self._store.key(principal.team_id)
        except Unavailable:  # the store down, or a stored policy that no longer validates: uncached
            self.metrics.requests.labels(str(principal.team_id), req.model, "error").inc()
            return None
        screening = b"" if ex.policy is None else canonical_json(ex.policy.policy.as_json())
        keys = match_keys(req.endpoint, req.body, key.hmac_key, screening)
        scope = Scope(principal.team_id, req.model, revision)
        return CacheTurn(policy, scope, key, keys, req.endpoint, model_cache.semantic_threshold)

    async def find(self, turn: CacheTurn, principal: Principal, ex: Exchange) -> CacheTurn | None:
        """The lookup, after the request was admitted: exact, then semantic where the team set a
        threshold. The same turn (`found` set on a hit), or None when the cache could not be asked."""
        assert self._store is not None
        started = time.monotonic()
        try:
            turn.found = await self._store.exact(turn.scope, turn.key, turn.keys.exact)
            semantic = await self._semantic(turn) if turn.found is None else None
            if semantic is not None:
                embedder, query, threshold = semantic
                turn.vector = await self._embed(embedder, query, principal, ex)
                if turn.vector is not None:
                    turn.found = await self._store.semantic(
                        turn.scope, turn.key, turn.keys.context, embedder, turn.vector, threshold
                    )
        except Unavailable:  # the store down, or a stored policy that no longer validates: uncached
            self.metrics.requests.labels(str(turn.scope.team_id), turn.scope.model, "error").inc()
            ex.headers.pop(CACHE_HEADER, None)
            return None
        match = "semantic" if turn.vector is not None else "exact"
        result = "hit" if turn.found is not None else "miss"
        self.metrics.lookup.labels(turn.scope.model, match, result).observe(time.monotonic() - started)
        ex.headers[CACHE_HEADER] = result
        return turn

    async def _semantic(self, turn: CacheTurn) -> tuple[str, str, float] | None:
        """(embedding model, question, threshold) when a semantic match is to be tried."""
        assert self._store is not None
        embedder, query, threshold = turn.policy.embedding_model, turn.keys.query, turn.threshold
        if embedder is None or query is None or threshold is None:
            return None
        return (embedder, query, threshold) if await self._store.semantic_available() else None

    async def _embed(self, model: str, text: str, principal: Principal, ex: Exchange) -> list[float] | None:
        """The question's embedding from the fleet (None: it could not be had; the exact match stands)."""
        req = validate_embeddings({"model": model, "input": text}, self._spec)
        answer = await self._call.run(req, principal, ex, EMBED_SUFFIX)
        try:
            vector = answer["data"][0]["embedding"] if answer is not None else None
        except (KeyError, IndexError, TypeError):
            return None
        if not isinstance(vector, list) or not vector or not all(isinstance(v, (int, float)) for v in vector):
            return None
        return [float(v) for v in vector]

    def dispatching(self, turn: CacheTurn | None, dreq: DispatchRequest) -> DispatchRequest:
        """A miss asks the fleet for usage (the entry's token counts)."""
        return dreq if turn is None else dreq.model_copy(update={"client_wants_usage": True})

    def capture(self, turn: CacheTurn | None, upstream: Upstream, client_wants_usage: bool) -> Upstream:
        if turn is None:
            return upstream
        turn.capture = CapturedAnswer(turn.endpoint)
        return CapturingUpstream(upstream, turn.capture, client_wants_usage)

    async def answer(
        self, turn: CacheTurn, req: InferenceRequest, principal: Principal, ex: Exchange
    ) -> Response:
        """A hit: billed at the cache price (reserved and settled here), replayed in the request's shape."""
        assert turn.found is not None
        assert principal.team_id is not None
        cached = turn.found.answer
        await self._ledger.reserve(
            request_id=ex.request_id,
            team_id=principal.team_id,
            key_id=principal.key_id,
            model=req.model,
            estimated_prompt_tokens=cached.prompt_tokens,
            max_tokens=cached.completion_tokens,
            quota_subject=principal.subject,
            cache="hit",
        )
        await self._ledger.settle(
            ex.request_id, cached.prompt_tokens, cached.completion_tokens, model_revision=turn.scope.revision
        )
        team = str(principal.team_id)
        result = "exact_hit" if turn.vector is None else "semantic_hit"
        self.metrics.requests.labels(team, req.model, result).inc()
        saved = cached.completion_tokens * self._gpu_s.get(req.model, 0.0)
        self.metrics.saved_gpu_seconds.labels(team, req.model).inc(saved)
        headers = {"x-request-id": ex.client_id, **ex.headers, MODEL_REVISION_HEADER: turn.scope.revision}
        answer_id = ID_PREFIX[turn.endpoint] + uuid.uuid4().hex
        if req.stream:
            events = cached.stream(answer_id, with_usage=req.wants_usage)
            return StreamingResponse(iter(list(events)), media_type="text/event-stream", headers=headers)
        return JSONResponse(cached.body(answer_id), headers=headers)

    def remember(self, turn: CacheTurn | None, team: str, revision: str, ended: str | None) -> None:
        """After a miss's response finished: store its answer in the background (the client never
        waits for it) if it came whole from the revision that was looked up."""
        if turn is None or self._store is None:
            return
        self.metrics.requests.labels(team, turn.scope.model, "miss").inc()
        answer = turn.capture.storable() if turn.capture is not None and ended == "done" else None
        if answer is None or revision != turn.scope.revision:
            self.metrics.writes.labels(turn.scope.model, "skipped").inc()
            return
        task = asyncio.ensure_future(self._write(turn, answer))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _write(self, turn: CacheTurn, answer: Any) -> None:
        assert self._store is not None
        try:
            await self._store.put(
                turn.scope,
                turn.key,
                answer,
                exact_key=turn.keys.exact,
                context_key=turn.keys.context,
                embedder=turn.embedder,
                vector=turn.vector,
                ttl_s=turn.policy.ttl_s,
                max_bytes=turn.policy.max_bytes,
            )
        except StoreUnavailable:
            self.metrics.writes.labels(turn.scope.model, "error").inc()
            return
        self.metrics.writes.labels(turn.scope.model, "stored").inc()

    async def janitor(self) -> None:
        """Forever (a task of the app's lifespan): every `JANITOR_INTERVAL_S`, delete expired entries of
        every team, a batch at a time. Several gateway processes may run it at once: each batch is one
        statement, and an entry deleted twice is deleted once."""
        if self._store is None:
            return
        while True:
            try:
                while await self._store.expire(EXPIRE_BATCH) >= EXPIRE_BATCH:
                    pass  # a full batch: more may be waiting
            except StoreUnavailable:
                log.warning("response cache janitor: the store is unavailable; next try in a minute")
            await asyncio.sleep(JANITOR_INTERVAL_S)  # a period, not a wait for a state

    async def drain(self) -> None:
        """Wait for the writes in flight (shutdown, tests)."""
        while self._writes:
            await asyncio.wait(set(self._writes))
