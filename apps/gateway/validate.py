"""Request validation before any quota or money is touched: body shape, model, limits, SSRF.

Prompt token estimate (conservative, for the reservation only; billing uses the engine's
exact counts): the UTF-8 byte length of the JSON-encoded `messages` plus 8 tokens per
message and 16 for the chat template. A byte-level BPE token always covers at least one
byte, so this is an upper bound for every tokenizer the catalog uses.

SSRF: every string under a key named `url` or ending in `_url` (at any depth, e.g.
`image_url.url`) must be `http(s)` to a public address, or an inline `data:` URL.
Hostnames are resolved and every address they resolve to must be public; a name that
does not resolve is refused (fail closed).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from apps.core.errors import InvalidRequest, NotFound
from apps.core.spec import StackSpec
from apps.gateway.ports import Resolver

MAX_WALK_DEPTH = 32


@dataclass(frozen=True)
class ChatRequest:
    body: dict[str, Any]
    model: str
    stream: bool
    wants_usage: bool
    max_tokens: int  # the effective per-choice bound, sent to the engine as `max_tokens`
    estimated_prompt_tokens: int
    n: int = 1

    @property
    def worst_case_completion_tokens(self) -> int:
        return self.n * self.max_tokens

    @property
    def worst_case_tokens(self) -> int:
        """What this request can cost at most, in tokens: the prompt bound + n x max_tokens."""
        return self.estimated_prompt_tokens + self.worst_case_completion_tokens


def parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise InvalidRequest("We could not parse the JSON body of your request.", param=None) from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.", param=None)
    return body


def _positive_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidRequest(f"'{name}' must be a positive integer.", param=name)
    return value


def estimate_prompt_tokens(messages: list[Any]) -> int:
    return len(json.dumps(messages, separators=(",", ":")).encode()) + 8 * len(messages) + 16


def validate_chat(body: dict[str, Any], spec: StackSpec) -> ChatRequest:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a string.", param="model")
    messages = body.get("messages")
    if messages is None:
        raise InvalidRequest("'messages' is a required property.", param="messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty array.", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InvalidRequest(f"'messages.{i}' must be an object with a 'role'.", param=f"messages.{i}")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be a boolean.", param="stream")
    options = body.get("stream_options")
    wants_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise InvalidRequest("'stream_options' must be an object.", param="stream_options")
        include = options.get("include_usage", False)
        if include is not None and not isinstance(include, bool):
            raise InvalidRequest("'include_usage' must be a boolean.", param="stream_options.include_usage")
        wants_usage = bool(include)
    model_spec = spec.models.get(model)
    if model_spec is None:
        raise NotFound(f"The model `{model}` does not exist.", param="model")
    max_tokens = _positive_int(body, "max_completion_tokens") or _positive_int(body, "max_tokens")
    context = model_spec.serving.max_model_len
    if max_tokens is not None and max_tokens > context:
        param = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        raise InvalidRequest(
            f"'{param}' is too large: {max_tokens}. This model's maximum context length is {context} tokens.",
            param=param,
        )
    n = _positive_int(body, "n") or 1
    if n > spec.request_limits.max_n:
        raise InvalidRequest(
            f"'n' is too large: {n}. At most {spec.request_limits.max_n} choices per request.", param="n"
        )
    return ChatRequest(
        body=body,
        model=model,
        stream=stream,
        wants_usage=wants_usage if stream else True,
        max_tokens=max_tokens or min(model_spec.serving.default_max_tokens, context),
        estimated_prompt_tokens=estimate_prompt_tokens(messages),
        n=n,
    )


def upstream_body(req: ChatRequest) -> dict[str, Any]:
    """The client's body with streaming and usage forced on and the effective `max_tokens` set, so
    the engine can never produce more than the reservation covers (`n` x `max_tokens`)."""
    body = dict(req.body)
    body["max_tokens"] = req.max_tokens
    if "max_completion_tokens" in body:  # vLLM prefers it over `max_tokens`: both say the same
        body["max_completion_tokens"] = req.max_tokens
    body["n"] = req.n
    body["stream"] = True
    options = dict(body.get("stream_options") or {})
    options["include_usage"] = True
    body["stream_options"] = options
    return body


def _url_values(node: Any, path: str, depth: int = 0) -> list[tuple[str, str]]:
    if depth > MAX_WALK_DEPTH:
        raise InvalidRequest("The request body is nested too deeply.", param=path or None)
    found: list[tuple[str, str]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            sub = f"{path}.{key}" if path else str(key)
            lowered = str(key).lower()
            if isinstance(value, str) and (lowered == "url" or lowered.endswith("_url")):
                found.append((sub, value))
            else:
                found.extend(_url_values(value, sub, depth + 1))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found.extend(_url_values(value, f"{path}.{i}", depth + 1))
    return found


def is_public_ip(text: str) -> bool:
    try:
        ip = ipaddress.ip_address(text.split("%")[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
        or not ip.is_global
    )


class SystemResolver:
    async def resolve(self, host: str) -> list[str]:
        infos = await asyncio.get_running_loop().getaddrinfo(host, None)
        return [str(info[4][0]) for info in infos]


async def check_ssrf(body: dict[str, Any], resolver: Resolver, timeout_s: float = 2.0) -> None:
    for param, url in _url_values(body, ""):
        if url.startswith("data:"):
            continue
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidRequest(
                f"URL scheme not allowed in '{param}' (http, https or data only).", param=param
            )
        host = parts.hostname
        try:
            addresses = (
                [host] if _is_ip_literal(host) else await asyncio.wait_for(resolver.resolve(host), timeout_s)
            )
        except (OSError, TimeoutError):
            raise InvalidRequest(f"The host in '{param}' does not resolve.", param=param) from None
        if not addresses or not all(is_public_ip(a) for a in addresses):
            raise InvalidRequest(f"'{param}' points at an internal address; refused.", param=param)


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    return True
