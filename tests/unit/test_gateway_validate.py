"""Body validation, the prompt estimate and the SSRF guard (no I/O: a static resolver)."""

from __future__ import annotations

from typing import Any

import pytest

from apps.core.errors import InvalidRequest, NotFound
from apps.core.protocol.engine import engine_body
from apps.core.protocol.node import Assign
from apps.core.spec import load_spec
from apps.gateway.validate import (
    InferenceRequest,
    check_ssrf,
    estimate_prompt_tokens,
    is_public_ip,
    validate_chat,
    wire_body,
)
from tests.fakes.static_resolver import StaticResolver

SPEC = load_spec("dev")
MODEL = "llama-3.1-8b-instruct"


def engine_sent(req: InferenceRequest) -> dict[str, Any]:
    """The engine's body for `req`, as the agent builds it from what the gateway sends."""
    assign = Assign(
        request_id="r",
        model=req.model,
        body=wire_body(req),
        budget=req.budget,
        wants_chunk_usage=req.wants_chunk_usage,
    )
    return engine_body(assign)


def test_defaults_and_forced_usage() -> None:
    req = validate_chat({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "extra": 1}, SPEC)
    assert req.max_tokens == SPEC.models[MODEL].serving.default_max_tokens
    assert req.stream is False
    assert req.wants_usage is True
    assert "extra" not in wire_body(req)  # neither an OpenAI field nor an allowed engine extra: dropped
    body = engine_sent(req)
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["max_tokens"] == req.max_tokens
    assert body["n"] == 1
    assert req.wants_chunk_usage is False
    streamed = validate_chat({"model": MODEL, "messages": [{"role": "user"}], "stream": True}, SPEC)
    assert streamed.wants_usage is False


def test_per_chunk_usage_is_wanted_only_by_a_client_that_wants_usage() -> None:
    def wants(options: dict[str, object]) -> bool:
        body = {"model": MODEL, "messages": [{"role": "user"}], "stream": True, "stream_options": options}
        return validate_chat(body, SPEC).wants_chunk_usage

    assert wants({"include_usage": True, "continuous_usage_stats": True})  # the agent keeps it
    # Forcing include_usage on must not switch per-chunk usage on for a client that did not ask.
    assert not wants({"continuous_usage_stats": True})
    assert not wants({"include_usage": False, "continuous_usage_stats": True})
    assert not wants({"include_usage": True})


def test_estimate_is_an_upper_bound_on_bytes() -> None:
    messages = [{"role": "user", "content": "héllo wörld " * 50}]
    text_bytes = len(("héllo wörld " * 50).encode())
    assert estimate_prompt_tokens(messages) > text_bytes


@pytest.mark.parametrize(
    ("body", "param", "exc"),
    [
        ({"messages": [{"role": "user"}]}, "model", InvalidRequest),
        ({"model": MODEL, "messages": []}, "messages", InvalidRequest),
        ({"model": MODEL, "messages": ["x"]}, "messages.0", InvalidRequest),
        ({"model": MODEL, "messages": [{"role": "u"}], "stream": 1}, "stream", InvalidRequest),
        ({"model": MODEL, "messages": [{"role": "u"}], "max_tokens": True}, "max_tokens", InvalidRequest),
        (
            {"model": MODEL, "messages": [{"role": "u"}], "max_completion_tokens": 10**6},
            "max_completion_tokens",
            InvalidRequest,
        ),
        (
            {"model": MODEL, "messages": [{"role": "u"}], "stream_options": []},
            "stream_options",
            InvalidRequest,
        ),
        ({"model": "x", "messages": [{"role": "u"}]}, "model", NotFound),
    ],
)
def test_invalid_bodies_name_the_param(body: dict[str, object], param: str, exc: type[Exception]) -> None:
    with pytest.raises(exc) as err:
        validate_chat(body, SPEC)
    assert getattr(err.value, "param", None) == param


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/",
        "http://[::1]/",
        "http://169.254.169.254/latest/meta-data",
        "http://10.1.2.3/",
        "http://192.168.0.1/",
        "http://[::ffff:127.0.0.1]/",
        "http://0.0.0.0/",
        "file:///etc/passwd",
        "gopher://x/",
        "http://internal.example/",
        "http://unresolvable.example/",
        "http://rebind.example/",
    ],
)
async def test_ssrf_refused(url: str) -> None:
    resolver = StaticResolver(
        {"internal.example": ["172.16.0.1"], "rebind.example": ["93.184.216.34", "127.0.0.1"]}
    )
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]}
    with pytest.raises(InvalidRequest) as err:
        await check_ssrf(body, resolver)
    assert err.value.param == "messages.0.content.0.image_url.url"


async def test_public_and_data_urls_pass() -> None:
    resolver = StaticResolver({"cdn.example": ["93.184.216.34"]})
    body = {
        "a": {"url": "https://cdn.example/x.png"},
        "b_url": "data:image/png;base64,AAAA",
        "c": [{"url": "http://8.8.8.8/"}],
    }
    await check_ssrf(body, resolver)
    assert is_public_ip("8.8.8.8")
    assert not is_public_ip("100.64.0.1")
