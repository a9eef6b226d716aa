"""Issue 21, input: the SSRF guard's gaps, the forwarded-field allowlist, and property tests that
no input makes a request parser (body, chat fields, times, admin fields) raise anything but a 4xx."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.core.errors import LlmfleetError
from apps.core.spec import load_spec
from apps.gateway.admin_routes import _opt_int, amount_microcredits, team_ref
from apps.gateway.fields import ENGINE_SAMPLING_EXTRAS
from apps.gateway.ssrf import check_ssrf, is_public_ip
from apps.gateway.usage import parse_time
from apps.gateway.validate import parse_body, validate_chat, wire_body
from tests.fakes.static_resolver import StaticResolver

SPEC = load_spec("dev")
MODEL = "llama-3.1-8b-instruct"
RESOLVER = StaticResolver({"public.example": ["93.184.216.34"], "inner.example": ["10.1.2.3"]})


def body_with(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}


def image(url: object, key: str = "image_url", typed: bool = True) -> dict[str, Any]:
    """A user message whose one content part makes the engine fetch `url`."""
    part: dict[str, Any] = {key: {"url": url}}
    if typed:
        part["type"] = key
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": "see"}, part]}]}


def bare(url: str, key: str = "image_url", part_type: str | None = None) -> dict[str, Any]:
    """A content part carrying the URL as a string (vLLM's parts without a type, `input_image`)."""
    part: dict[str, Any] = {key: url} | ({"type": part_type} if part_type else {})
    return {"messages": [{"role": "user", "content": [part]}]}


P = "messages.0.content.1.image_url.url"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        (image("http://127.0.0.1/a.png"), P),
        (image("http://inner.example/a.png"), P),  # a name resolving inward
        (image("http://169.254.169.254/latest/meta-data/"), P),
        (image("http://10.0.0.1/a.wav", "audio_url"), "messages.0.content.1.audio_url.url"),
        (image("http://10.0.0.1/a.mp4", "video_url"), "messages.0.content.1.video_url.url"),
        (image("http://10.0.0.1/a.png", typed=False), P),  # vLLM takes a part without a type
        (bare("http://10.0.0.1/a.png"), "messages.0.content.0.image_url"),
        (bare("http://10.0.0.1/a.png", part_type="input_image"), "messages.0.content.0.image_url"),
        (bare("http://10.0.0.1/a.mp4", "video_url"), "messages.0.content.0.video_url"),
        (image(["http://127.0.0.1/"]), P),  # not a string: vLLM would refuse it, after the money
        (image({"href": "http://10.0.0.1/"}), P),
        (image("http://127.0.0.1\\@8.8.8.8/"), P),  # backslash: parsers disagree
        (image("http://user@8.8.8.8/"), P),  # userinfo
        (image("http://[2002:7f00:1::]/"), P),  # 6to4 of 127.0.0.1
        (image("http://[64:ff9b::a00:1]/"), P),  # NAT64 of 10.0.0.1
        (image("http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/"), P),  # Teredo
        (image("http://[::127.0.0.1]/"), P),  # IPv4-compatible
        (image("http://2130706433/"), P),  # 127.0.0.1 as one number
        (image("http://0x7f.1/"), P),
        (image("http://pub lic.example/"), P),
        (image(" http://127.0.0.1/"), P),  # urlsplit strips the space, vLLM would fetch it
        (image("gopher://public.example/"), P),
        (image("file:///etc/passwd"), P),
    ],
)  # fmt: skip
async def test_urls_the_engine_fetches_are_checked(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(LlmfleetError) as err:
        await check_ssrf(body_with(**extra), RESOLVER)
    assert err.value.status == 400
    assert err.value.param == param


TOOL_SCHEMA = {
    "type": "object",
    "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}}}},
    "properties": {
        "url": {"type": "string", "description": "the page to fetch", "default": "http://127.0.0.1/"},
        "image": {"type": "string", "examples": ["http://10.0.0.1/cat.png"]},
        "src": {"type": "string"},
        "href": {"type": "string", "format": "uri"},
        "callback_url": {"type": "string"},
        "where": {"$ref": "#/$defs/point"},
        "remote": {"$ref": "http://10.0.0.1/schema.json"},
    },
    "required": ["url"],
}


async def test_tool_schemas_and_everything_the_engine_does_not_fetch_pass() -> None:
    """Issue 27 item 8: tool parameters named `url`, `image`, `src`, `href`, any `$ref`, URLs in a
    schema's defaults or examples, in `response_format`, prompt text or metadata: the engine fetches
    none of them, so none is refused."""
    await check_ssrf(
        body_with(
            messages=[
                {"role": "user", "content": "http://127.0.0.1/ is my dev server"},
                {"role": "user", "content": [{"type": "text", "text": "http://10.0.0.1/"}]},
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]},
                {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]},
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://public.example/a.png"}}]},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "fetch", "arguments": '{"url": "http://127.0.0.1/"}'}},
                ]},
                {"role": "tool", "tool_call_id": "c1", "content": '{"href": "http://10.0.0.1/"}'},
            ],
            tools=[{"type": "function", "function": {"name": "fetch", "parameters": TOOL_SCHEMA}}],
            response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": TOOL_SCHEMA}},
            metadata={"source_url": "http://10.0.0.1/"},
        ),
        RESOLVER,
    )  # fmt: skip


def test_transition_ranges_are_not_public() -> None:
    for address in ("2002:808:808::", "64:ff9b::808:808", "2001:0:53aa:64c::1", "::8.8.8.8"):
        assert not is_public_ip(address), address
    assert is_public_ip("2606:4700:4700::1111")


def test_only_openai_fields_and_the_engine_extras_are_forwarded() -> None:
    engine_only = {
        "kv_transfer_params": {"x": 1},
        "chat_template": "{{ secrets }}",
        "logits_processors": ["evil.Processor"],
        "chat_template_kwargs": {"a": 1},
        "best_of": 50,
        "priority": -100,
    }
    allowed = {"top_k": 5, "min_p": 0.1, "temperature": 0.2, "seed": 7, "tools": []}
    sent = wire_body(validate_chat(body_with(**engine_only, **allowed), SPEC))
    assert not set(engine_only) & set(sent)
    assert {k: sent[k] for k in allowed} == allowed
    assert {"top_k", "min_p", "ignore_eos"} <= ENGINE_SAMPLING_EXTRAS


# -- no 5xx from input ------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
FIELDS = st.sampled_from(
    ["model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens", "n", "x"]
)
CHAT_BODIES = st.fixed_dictionaries(
    {"model": st.sampled_from([MODEL, "nope", 5, None]), "messages": JSON}, optional={}
).flatmap(lambda base: st.dictionaries(FIELDS, JSON, max_size=5).map(lambda extra: {**base, **extra}))


def _status(fn: Any, *args: Any) -> int:
    """200 if `fn` accepted the input, else the status of the error it raised (anything other than
    an `LlmfleetError` propagates: that would be a 500)."""
    try:
        fn(*args)
    except LlmfleetError as exc:
        return exc.status
    return 200


def _client_error(fn: Any, *args: Any) -> None:
    status = _status(fn, *args)
    assert status == 200 or 400 <= status < 500, status


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200) | JSON.map(lambda v: json.dumps(v).encode()))
def test_no_body_makes_the_parser_fail_other_than_with_a_4xx(raw: bytes) -> None:
    _client_error(parse_body, raw)


@settings(max_examples=150, deadline=None)
@given(CHAT_BODIES)
def test_no_chat_body_makes_validation_fail_other_than_with_a_4xx(body: dict[str, Any]) -> None:
    _client_error(lambda b: json.dumps(wire_body(validate_chat(b, SPEC))).encode(), body)


@settings(max_examples=150, deadline=None)
@given(
    JSON
    | st.sampled_from(
        ["1e20", "inf", "-inf", "nan", "-1", "9999-12-31T23:59:59-23:59", "0001-01-01T00:00+01:00"]
    )
)
def test_no_time_makes_the_time_parser_fail_other_than_with_a_4xx(value: Any) -> None:
    _client_error(parse_time, value, "from")


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(["team", "team_id", "amount", "amount_microcredits", "rpm"]), JSON))
def test_no_admin_field_makes_its_parser_fail_other_than_with_a_4xx(body: dict[str, Any]) -> None:
    _client_error(team_ref, body)
    _client_error(lambda v: team_ref(v, query=True), {k: str(v) for k, v in body.items()})
    _client_error(amount_microcredits, body)
    _client_error(_opt_int, body, "rpm")


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
        b'{"model":"m","messages":[{"role":"user","content":"\\ud800"}]}',
    ],
)
def test_deep_nesting_and_lone_surrogates_are_400(raw: bytes) -> None:
    with pytest.raises(LlmfleetError) as err:
        parse_body(raw)
    assert err.value.status == 400
