"""HTTP client of the local engine (vLLM or enginesim on localhost, docs/architecture.md D7).

Owns the engine's non-streaming endpoints the agent needs (over aiohttp): `/health`
(readiness before registering), `/v1/models` (`max_model_len`), `/metrics` (heartbeat
load), and `POST /tokenize` (exact prompt tokens after an abort, the one exception to docs/architecture.md D5,
see `relay.py`). Every assignment's request (the streaming `POST /v1/chat/completions` and
`/v1/completions`, the one-answer `POST /v1/embeddings`) goes over
`apps.netio.http_client` (`open`): the per-chunk path of one stream per running
request, where that client costs the fewest microseconds (one write per request, body pieces
handed over as they arrive, read flow control); closing a response early drops its
connection, which is how vLLM learns to abort the request.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from apps.core.protocol.engine import ENGINE_PATHS
from apps.netio.http_client import HostPool, HttpResponse

log = logging.getLogger("llmfleet.agent.engine")

CHAT_PATH = ENGINE_PATHS[None]
# Under uvicorn's keep-alive timeout (5 s; vLLM serves with uvicorn), so an idle pooled
# connection is dropped by us first (a stale one costs a retry; nothing ran on it).
ENGINE_IDLE_TIMEOUT_S = 4.0
STREAM_LIMIT = 100_000  # concurrent streams: the engine's max_num_seqs is the real bound
TOKEN_IDS_TIMEOUT_S = 15.0  # a prefix announcement's tokenizer call (background, not a probe)


@dataclass(frozen=True)
class EngineLoad:
    queue_depth: int
    kv_cache_usage: float
    running: int


def parse_engine_metrics(text: str) -> EngineLoad | None:
    """Queue depth and KV use from vLLM's Prometheus text.

    Sums `vllm:num_requests_waiting` / `running` over engines (data parallelism gives one
    series per engine) and takes the highest KV use. Accepts the pre-0.9.2 name
    `vllm:gpu_cache_usage_perc` when `vllm:kv_cache_usage_perc` is absent. Returns None
    when the page has no vLLM load metrics at all (e.g. `--disable-log-stats`).
    """
    waiting: float | None = None
    running = 0.0
    kv_new: float | None = None
    kv_old: float | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:num_requests_waiting":
                waiting = (waiting or 0.0) + sample.value
            elif sample.name == "vllm:num_requests_running":
                running += sample.value
            elif sample.name == "vllm:kv_cache_usage_perc":
                kv_new = max(kv_new or 0.0, sample.value)
            elif sample.name == "vllm:gpu_cache_usage_perc":
                kv_old = max(kv_old or 0.0, sample.value)
    kv = kv_new if kv_new is not None else kv_old
    if waiting is None and kv is None:
        return None
    return EngineLoad(
        queue_depth=max(0, int(waiting or 0)),
        kv_cache_usage=min(1.0, max(0.0, kv or 0.0)),
        running=max(0, int(running)),
    )


def tokenize_body(chat_body: dict[str, Any]) -> dict[str, Any]:
    """The chat form of vLLM's `/tokenize` for a chat request: the same template, so the
    count equals the `prompt_tokens` the engine would have reported; for a completion (a `prompt`,
    no `messages`), its completion form."""
    if "messages" not in chat_body and "prompt" in chat_body:
        return {k: chat_body[k] for k in ("model", "prompt") if k in chat_body}
    body: dict[str, Any] = {"messages": chat_body.get("messages", []), "add_generation_prompt": True}
    for key in ("model", "tools", "chat_template", "chat_template_kwargs", "continue_final_message"):
        if key in chat_body:
            body[key] = chat_body[key]
    if chat_body.get("continue_final_message"):
        body["add_generation_prompt"] = False
    return body


class EngineClient:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        probe_timeout_s: float,
        *,
        connect_timeout_s: float = 5.0,
    ) -> None:
        self._session = session
        self._base = base_url.rstrip("/")
        self._probe_timeout = aiohttp.ClientTimeout(total=probe_timeout_s)
        self._streams = HostPool(
            self._base,
            limit=STREAM_LIMIT,
            connect_timeout_s=connect_timeout_s,
            idle_timeout_s=ENGINE_IDLE_TIMEOUT_S,
        )
        # The request head of each endpoint's path, built once.
        self._heads = {
            path: self._streams.head(
                "POST", self._streams.base_path + path, {"Content-Type": "application/json"}
            )
            for path in ENGINE_PATHS.values()
        }

    async def open(self, path: str, body: dict[str, Any]) -> HttpResponse:
        """Send a request to one of `ENGINE_PATHS`; returns once the status and headers arrived.
        Raises `apps.netio.http_client.Unreachable` when the request surely did not run (refused,
        connect timeout), `ConnectionError` when the engine dropped it."""
        return await self._streams.send(self._heads[path], json.dumps(body, separators=(",", ":")).encode())

    async def open_chat(self, body: dict[str, Any]) -> HttpResponse:
        """A streaming chat request (`open` on the chat path)."""
        return await self.open(CHAT_PATH, body)

    async def aclose(self) -> None:
        await self._streams.aclose()

    @property
    def session(self) -> aiohttp.ClientSession:
        return self._session

    def url(self, path: str) -> str:
        return self._base + path

    async def healthy(self) -> bool:
        try:
            async with self._session.get(self.url("/health"), timeout=self._probe_timeout) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def max_model_len(self, model: str) -> int | None:
        try:
            async with self._session.get(self.url("/v1/models"), timeout=self._probe_timeout) as resp:
                if resp.status != 200:
                    return None
                data = await resp.json()
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        raw_cards = data.get("data") if isinstance(data, dict) else None
        cards: list[Any] = raw_cards if isinstance(raw_cards, list) else []
        for card in cards:
            if (
                isinstance(card, dict)
                and isinstance(card.get("max_model_len"), int)
                and (card.get("id") == model or len(cards) == 1)
            ):
                return int(card["max_model_len"])
        return None

    async def load(self) -> EngineLoad | None:
        try:
            async with self._session.get(self.url("/metrics"), timeout=self._probe_timeout) as resp:
                if resp.status != 200:
                    return None
                text = await resp.text()
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
            return None
        try:
            return parse_engine_metrics(text)
        except ValueError:
            log.warning("engine /metrics is not Prometheus text")
            return None

    async def token_ids(self, chat_body: dict[str, Any]) -> list[int] | None:
        """The token ids of a chat body's messages as the engine's template renders them, without a
        generation prompt (a conversation prefix), or None if the engine cannot answer. For a prefix
        announcement, in the background: it waits longer than a probe (a busy engine's tokenizer can
        take more than the probe's few seconds, and the announcement was lost)."""
        body = {**tokenize_body(chat_body), "add_generation_prompt": False}
        data = await self._tokenize(body, aiohttp.ClientTimeout(total=TOKEN_IDS_TIMEOUT_S))
        tokens = data.get("tokens")
        return tokens if isinstance(tokens, list) and all(isinstance(t, int) for t in tokens) else None

    async def prompt_tokens(self, chat_body: dict[str, Any]) -> int | None:
        """Exact prompt tokens from `POST /tokenize` (chat form), or None if the engine
        cannot answer (e.g. it died, which is why the stream broke)."""
        count = (await self._tokenize(tokenize_body(chat_body))).get("count")
        return count if isinstance(count, int) and count >= 0 else None

    async def _tokenize(
        self, body: dict[str, Any], limit: aiohttp.ClientTimeout | None = None
    ) -> dict[str, Any]:
        """The engine's `POST /tokenize` answer ({} when it cannot answer)."""
        try:
            async with self._session.post(
                self.url("/tokenize"), json=body, timeout=limit or self._probe_timeout
            ) as resp:
                if resp.status != 200:
                    return {}
                data = json.loads(await resp.read())
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}
