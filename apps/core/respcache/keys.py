"""What the response cache may answer, and the keys it matches on (docs/response-cache.md).

`bypass_reason` says why a request is never cached (None: it may be): an embeddings request, `n` above
1, sampling above the team's `max_temperature`, tools or functions, log probabilities, `echo`/`suffix`,
content other than text (an image or audio part: its bytes may change behind a URL), or `stream_options`
other than `include_usage` (a replay has no per-chunk usage to give).

`match_keys` normalises a request: the fields that do not change the answer (`stream`, `stream_options`,
`user`, `metadata`, `store`, `service_tier`, the client's `priority`, nulls) are dropped and the rest is
serialised canonically (sorted keys, no spaces). The exact key is its HMAC under the team's key; the
context key is the HMAC of the same request with the last user turn's text left out (the semantic match's
scope: same model, parameters, system prompt and earlier turns); the query is that text, which is what
is embedded. A request whose last turn is not a user's text has no semantic match.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

from apps.core.respcache.policy import CachePolicy

ANSWER_NEUTRAL = frozenset(
    {"stream", "stream_options", "user", "metadata", "store", "service_tier", "priority"}
)
TOOLS = ("tools", "functions", "tool_choice", "function_call", "parallel_tool_calls")
LOGPROBS = ("logprobs", "top_logprobs", "prompt_logprobs", "echo", "suffix")
DEFAULT_TEMPERATURE = 1.0  # vLLM's (and OpenAI's) when a request names none
QUERY_MARK = "\x00llmfleet-query\x00"


@dataclass(frozen=True)
class MatchKeys:
    exact: bytes
    context: bytes
    query: str | None  # the last user turn's text, embedded for a semantic match (None: no semantic match)


def _text_only(content: object) -> bool:
    if content is None or isinstance(content, str):
        return True
    if isinstance(content, list):
        return all(isinstance(p, dict) and p.get("type") == "text" for p in content)
    return False


def bypass_reason(endpoint: str, body: dict[str, Any], policy: CachePolicy) -> str | None:
    if endpoint not in ("chat", "completions"):
        return "endpoint"
    if (body.get("n") or 1) > 1:
        return "n"
    temperature = body.get("temperature")
    if (DEFAULT_TEMPERATURE if temperature is None else float(temperature)) > policy.max_temperature:
        return "temperature"
    if any(body.get(name) not in (None, "none", []) for name in TOOLS):
        return "tools"
    if any(body.get(name) not in (None, False, 0) for name in LOGPROBS):
        return "logprobs"
    options = body.get("stream_options")
    if isinstance(options, dict) and set(options) - {"include_usage"}:
        return "stream_options"
    if endpoint == "chat":
        messages = body.get("messages") or []
        if not all(isinstance(m, dict) and _text_only(m.get("content")) for m in messages):
            return "content"
    return None


def canonical_json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _canonical(body: dict[str, Any]) -> bytes:
    return canonical_json({k: v for k, v in body.items() if k not in ANSWER_NEUTRAL and v is not None})


def _query(endpoint: str, body: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """(the last user turn's text, the body with it replaced by a mark), or (None, body)."""
    if endpoint == "completions":
        prompt = body.get("prompt")
        return (
            (prompt, {**body, "prompt": QUERY_MARK}) if isinstance(prompt, str) and prompt else (None, body)
        )
    messages = body.get("messages") or []
    last = messages[-1] if messages else None
    if not isinstance(last, dict) or last.get("role") != "user":
        return None, body
    content = last.get("content")
    if isinstance(content, list):
        content = "".join(str(p.get("text", "")) for p in content)
    if not isinstance(content, str) or not content:
        return None, body
    return content, {**body, "messages": [*messages[:-1], {**last, "content": QUERY_MARK}]}


def match_keys(endpoint: str, body: dict[str, Any], hmac_key: bytes, screening: bytes = b"") -> MatchKeys:
    """`screening`: what the team's output guardrails are (their policy, canonical): an answer stored under
    one policy is never replayed under another, which might redact or block it."""

    def mac(data: bytes) -> bytes:
        scope = endpoint.encode() + b"\n" + hashlib.sha256(screening).digest() + b"\n"
        return hmac.new(hmac_key, scope + data, hashlib.sha256).digest()

    query, context = _query(endpoint, body)
    return MatchKeys(exact=mac(_canonical(body)), context=mac(_canonical(context)), query=query)
