"""The one error table (apps/core/error_table.py): every entry comes out of every process in the
same wire form, before the first chunk (the HTTP answer) and after it (one SSE error event and
`[DONE]`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apps.agent.errors import from_http
from apps.agent.relay import Relay, RelayTimeouts
from apps.core.error_table import BY_CODE, TABLE, TIMEOUT, UPSTREAM_ERROR, WireError, for_frame, stream_error
from apps.core.errors import http_error, retry_after_header
from apps.core.protocol.node import Assign, Error
from apps.gateway.errors import error_response as gateway_answer
from apps.gateway.exchange import upstream_error
from apps.gateway.relay import RelayResponse
from apps.orchestrator.answers import error_response as orchestrator_answer
from apps.orchestrator.answers import mid_stream_error
from apps.orchestrator.streams import ErrorEv, LostEv, LostReason

pytestmark = pytest.mark.timeout(30)
GATEWAY_OWN = (UPSTREAM_ERROR, TIMEOUT)


def _event(data: bytes) -> dict[str, object]:
    """The one error event of a failed stream's end, which must be followed by `[DONE]`."""
    assert data.endswith(b"\n\ndata: [DONE]\n\n")
    head, _, _ = data.partition(b"\n\n")
    error = json.loads(head.removeprefix(b"data: "))["error"]
    assert isinstance(error, dict)
    return error


def _form(entry: WireError) -> dict[str, object]:
    return {"type": entry.type, "code": entry.code}


async def _agent_frame(entry: WireError) -> tuple[int, str]:
    """What the agent sends for `entry` (its `error` frame's status and type)."""
    relay = Relay(Assign(request_id="r", model="m", body={"messages": []}), None, None, RelayTimeouts())  # type: ignore[arg-type]
    frame = await relay._failed(entry, "boom")
    return frame.status, frame.error_type


def test_codes_are_unique_strings() -> None:
    assert len(BY_CODE) == len(TABLE)
    assert all(isinstance(e.code, str) and e.code for e in TABLE)
    assert all(e.before_first_chunk or e.after_first_chunk for e in TABLE)


@pytest.mark.parametrize("entry", [e for e in TABLE if e.before_first_chunk], ids=lambda e: e.code)
def test_before_the_first_chunk_every_process_answers_the_same(entry: WireError) -> None:
    hint = 7.0 if entry.status in (429, 503) else None
    exc = entry.exception("nope", param="p", retry_after=hint)
    status, headers, body = http_error(exc)
    assert (status, body["error"]) == (entry.status, {"message": "nope", "param": "p", **_form(entry)})
    if "orchestrator" in entry.by:  # its answer, and the gateway's answer to that
        answer = orchestrator_answer(exc, "r1")
        assert answer.status == entry.status
        assert isinstance(answer.body, bytes)
        forwarded = upstream_error(answer.status, answer.body, answer.headers.get("Retry-After"))
        status, headers, body = http_error(forwarded)
        assert status == entry.status
        assert {k: body["error"][k] for k in ("type", "code")} == _form(entry)  # type: ignore[index]
        if status < 500:
            assert body["error"]["param"] == "p"  # type: ignore[index]
        if hint is not None:
            assert headers["Retry-After"] == retry_after_header(hint)
    gateway = gateway_answer(exc)
    assert gateway.status_code == entry.status
    assert json.loads(gateway.body)["error"] == {"message": "nope", "param": "p", **_form(entry)}


@pytest.mark.parametrize("entry", [e for e in TABLE if e.after_first_chunk], ids=lambda e: e.code)
async def test_after_the_first_chunk_every_process_writes_the_same_event(entry: WireError) -> None:
    # The agent's frame for it, mapped back by the orchestrator, gives the same event (which the
    # gateway passes on byte for byte).
    if entry.by == ("gateway",):  # only the gateway ends a stream with it (a guardrail's block)
        assert _event(stream_error(entry, "boom")) == {"message": "boom", "param": None, **_form(entry)}
        return
    if "agent" in entry.by:
        status, error_type = await _agent_frame(entry)
        assert for_frame(status, error_type) is entry
    from_node = await _relay_frame(entry)
    assert _event(from_node) == {"message": "boom", "param": None, **_form(entry)}
    assert from_node == stream_error(entry, "boom")
    if (
        entry in GATEWAY_OWN
    ):  # the gateway's own ends of a stream (its orchestrator's stream broke or went silent)
        sent: list[dict[str, object]] = []

        async def send(message: dict[str, object]) -> None:
            sent.append(message)

        await RelayResponse._fail(None, send, "boom", entry)  # type: ignore[arg-type]
        assert sent[0]["body"] == from_node


async def _relay_frame(entry: WireError) -> bytes:
    status, error_type = await _agent_frame(entry)
    return mid_stream_error(
        ErrorEv(Error(request_id="r", status=status, message="boom", error_type=error_type)), 30
    )


def test_the_orchestrators_own_mid_stream_ends_are_table_entries() -> None:
    assert _event(mid_stream_error(None, 30)) == {
        "message": "no output from the node for 30 s",
        "param": None,
        **_form(BY_CODE["timeout"]),
    }
    assert _event(mid_stream_error(LostEv(LostReason.NODE_GONE), 30))["code"] == UPSTREAM_ERROR.code


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (400, "invalid_request"),
        (422, "invalid_request"),
        (404, "model_not_found"),
        (401, "upstream_error"),
        (429, "service_unavailable"),
        (503, "service_unavailable"),
        (500, "upstream_error"),
        (504, "timeout"),
    ],
)
def test_the_engines_statuses_map_to_table_entries(status: int, code: str) -> None:
    err = from_http(status, b'{"error": {"message": "m", "type": "t", "code": 0}}')
    assert err.entry is BY_CODE[code]


def test_docs_errors_lists_the_table() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "errors.md").read_text()
    for entry in TABLE:
        assert f"| `{entry.code}` | {entry.status} | `{entry.type}` |" in doc, entry.code
