"""Golden JSON of every frame of the orchestrator <-> agent protocol.

Each fixture in tests/fixtures/protocol/ is the exact output of `encode`; decoding it
with the right direction's decoder and encoding again gives the same bytes.
"""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest
from pydantic import ValidationError

from apps.core.budget import Budget
from apps.core.protocol import node as proto
from apps.core.protocol.engine import engine_body, legacy_assign, wants_chunk_usage
from apps.core.sharing import PriorityClass

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "protocol"
NODE_TYPES = {
    "register",
    "heartbeat",
    "chunk",
    "done",
    "error",
    "drained",
    "handed_over",
    "kv_events",
    "kv_prefix",
    "kv_reset",
}
SERVER_TYPES = {
    "register_ack",
    "register_refused",
    "assign",
    "cancel",
    "load_model",
    "drain",
    "handover",
    "done_ack",
}


def _frame_classes(annotated: object) -> set[str]:
    union = typing.get_args(annotated)[0]
    return {cls.model_fields["type"].default for cls in typing.get_args(union)}


def test_fixture_sets_match_the_protocol() -> None:
    assert _frame_classes(proto.NodeFrame) == NODE_TYPES
    assert _frame_classes(proto.ServerFrame) == SERVER_TYPES
    types_with_fixture: set[str] = {proto.decode_node_frame(p.read_bytes()).type for p in _node_fixtures()}
    types_with_fixture |= {proto.decode_server_frame(p.read_bytes()).type for p in _server_fixtures()}
    assert types_with_fixture == NODE_TYPES | SERVER_TYPES


def _node_fixtures() -> list[Path]:
    return sorted(p for p in FIXTURES.glob("*.json") if _type_of(p) in NODE_TYPES)


def _server_fixtures() -> list[Path]:
    return sorted(p for p in FIXTURES.glob("*.json") if _type_of(p) in SERVER_TYPES)


def _type_of(path: Path) -> str:
    import json

    return str(json.loads(path.read_bytes())["type"])


@pytest.mark.parametrize("path", _node_fixtures(), ids=lambda p: p.stem)
def test_node_frames_round_trip_byte_for_byte(path: Path) -> None:
    raw = path.read_text()
    frame = proto.decode_node_frame(raw)
    assert proto.encode(frame) == raw


@pytest.mark.parametrize("path", _server_fixtures(), ids=lambda p: p.stem)
def test_server_frames_round_trip_byte_for_byte(path: Path) -> None:
    raw = path.read_text()
    frame = proto.decode_server_frame(raw)
    assert proto.encode(frame) == raw


def test_directions_are_not_mixed_up() -> None:
    with pytest.raises(ValidationError):
        proto.decode_server_frame((FIXTURES / "done.json").read_text())
    with pytest.raises(ValidationError):
        proto.decode_node_frame((FIXTURES / "assign.json").read_text())


def test_unknown_fields_and_types_are_rejected() -> None:
    with pytest.raises(ValidationError):
        proto.decode_node_frame('{"type":"heartbeat","queue_depth":1,"kv_cache_usage":0.1,"bogus":1}')
    with pytest.raises(ValidationError):
        proto.decode_node_frame('{"type":"teleport","request_id":"x"}')
    with pytest.raises(ValidationError):
        proto.decode_node_frame('{"type":"heartbeat","queue_depth":1,"kv_cache_usage":1.5}')


def test_chunk_delta_keeps_engine_bytes_exactly() -> None:
    frame = proto.decode_node_frame((FIXTURES / "chunk.json").read_text())
    assert isinstance(frame, proto.Chunk)
    assert frame.delta.startswith("data: {")
    assert frame.delta.endswith("}\n\n")
    assert "\\u00e9" in frame.delta  # the engine's own escaping survives, not re-encoded


def test_done_carries_the_raw_usage_event() -> None:
    frame = proto.decode_node_frame((FIXTURES / "done.json").read_text())
    assert isinstance(frame, proto.Done)
    assert frame.usage_event is not None
    assert '"choices":[]' in frame.usage_event
    assert (frame.prompt_tokens, frame.completion_tokens) == (12, 5)


# -- the hand-written chunk encoder is byte-identical to pydantic's -------------------------

_TRICKY = [
    "",
    "".join(chr(i) for i in range(0x80)),  # every control character, quote and backslash
    'data: {"choices":[{"delta":{"content":"Hi \\u00e9 \\"q\\""}}]}\n\n',  # JSON escapes in the payload
    "é ü 中文 \u2028 \u2029 \ufeff \x7f 😀",  # non-ASCII stays UTF-8, as pydantic writes it
]


@pytest.mark.parametrize("text", _TRICKY)
def test_encode_chunk_matches_the_pydantic_codec(text: str) -> None:
    for request_id in ("req-1", text):
        expected = proto.Chunk(request_id=request_id, delta=text).model_dump_json()
        assert proto.encode_chunk(request_id, text) == expected
        assert proto.encode(proto.Chunk(request_id=request_id, delta=text)) == expected


def test_encode_chunk_reproduces_the_golden_fixture() -> None:
    golden = (FIXTURES / "chunk.json").read_text()
    frame = proto.decode_node_frame(golden)
    assert isinstance(frame, proto.Chunk)
    assert proto.encode_chunk(frame.request_id, frame.delta) == golden


def test_version_2_batch_golden_message_splits_into_frames_byte_for_byte() -> None:
    raw = (FIXTURES / "batch_v2.txt").read_text()
    texts = proto.split_frames(raw)
    assert [proto.decode_node_frame(t).type for t in texts] == ["chunk", "heartbeat", "done"]
    assert [proto.encode(proto.decode_node_frame(t)) for t in texts] == texts
    assert proto.join_frames(texts) == raw
    assert proto.split_frames(texts[0]) == [texts[0]]  # a version-1 message: one frame


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.json")), ids=lambda p: p.stem)
def test_an_encoded_frame_never_holds_a_raw_newline(path: Path) -> None:
    """What makes one frame per line safe: compact JSON escapes the SSE deltas' newlines."""
    frame = proto.decode_node_frame(path.read_text()) if _type_of(path) in NODE_TYPES else None
    if frame is not None:
        assert "\n" not in proto.encode(frame)
    assert "\n" not in proto.encode_chunk("r", "data: {}\n\n\r\u2028")


def test_the_orchestrator_accepts_every_version() -> None:
    assert {1, 2, 3, 4, 5, 6, 7} == proto.SUPPORTED_VERSIONS
    assert proto.BATCHING_VERSION == 2
    assert proto.HANDOVER_VERSION == 3
    assert proto.INTENT_VERSION == 4
    assert proto.KV_EVENTS_VERSION == 5
    assert proto.REVISIONS_VERSION == 6
    assert proto.PROTOCOL_VERSION == proto.ENDPOINTS_VERSION == 7


def test_an_assign_with_an_endpoint_round_trips_and_a_chat_one_names_none() -> None:
    embed = proto.Assign(request_id="r", model="m", body={"input": "x"}, endpoint="embeddings")
    raw = proto.encode(embed)
    assert json.loads(raw)["endpoint"] == "embeddings"
    assert proto.decode_server_frame(raw) == embed
    chat = proto.Assign(request_id="r", model="m", body={"messages": []})
    assert "endpoint" not in json.loads(proto.encode(chat))


def test_a_register_without_revisions_is_the_version_1_to_5_frame() -> None:
    """Version 6 names each model's revision; a frame without one encodes as before (no field an
    older orchestrator would refuse: it parses with `extra="forbid"`)."""
    old = (FIXTURES / "register.json").read_text()
    frame = proto.decode_node_frame(old)
    assert isinstance(frame, proto.Register)
    assert frame.models[0].revision == ""
    assert proto.encode(frame) == old
    assert "revision" not in old
    new = proto.decode_node_frame((FIXTURES / "register_v6.json").read_text())
    assert isinstance(new, proto.Register)
    assert new.models[0].revision == "2026-11-20"
    with pytest.raises(ValidationError):
        proto.decode_node_frame(
            old.replace('"max_model_len":8192', '"max_model_len":8192,"revision":"' + "r" * 129 + '"')
        )


def test_a_version_4_assign_carries_intent_and_an_older_node_gets_the_engine_body() -> None:
    """Version 4: the client's body and the intent; the agent builds the engine's body once. A node
    before version 4 gets that body built (and no field it would refuse)."""
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "stream_options": {"continuous_usage_stats": True},
    }
    assign = proto.Assign(
        request_id="r1",
        model="m",
        body=body,
        budget=Budget(30, 8, 2),
        wants_chunk_usage=False,
        priority_class=PriorityClass.BATCH,
        continuation="so far",
    )
    assert proto.decode_server_frame(proto.encode(assign)) == assign
    built = engine_body(assign)
    assert (built["max_tokens"], built["n"], built["priority"], built["model"]) == (4, 2, 10, "m")
    assert built["messages"][-1] == {"role": "assistant", "content": "so far"}
    assert (built["continue_final_message"], built["add_generation_prompt"]) == (True, False)
    assert built["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    legacy = legacy_assign(assign)
    assert set(json.loads(proto.encode(legacy))) == {"type", "request_id", "model", "body"}
    # The per-chunk option stays only for a client that asked (that agent reads it from the body).
    assert legacy.body == {**built, "stream_options": {"include_usage": True}}
    plain = proto.Assign(request_id="r1", model="m", body=body)
    assert set(json.loads(proto.encode(plain))) == {"type", "request_id", "model", "body"}
    assert wants_chunk_usage(plain)  # an older orchestrator's body: the option says it


def test_handover_frames_golden_both_directions() -> None:
    """`handover` goes server -> node only, `handed_over` node -> server only; both byte for byte."""
    down = (FIXTURES / "handover.json").read_text()
    up = (FIXTURES / "handed_over.json").read_text()
    frame = proto.decode_server_frame(down)
    assert isinstance(frame, proto.Handover)
    assert frame.deadline_s == 30.0
    assert proto.encode(proto.Handover(deadline_s=30.0)) == down
    back = proto.decode_node_frame(up)
    assert isinstance(back, proto.HandedOver)
    assert back.in_flight == ["req-1", "req-2"]
    assert proto.encode(proto.HandedOver(orchestrator_id="orch-1", in_flight=["req-1", "req-2"])) == up
    with pytest.raises(ValidationError):
        proto.decode_node_frame(down)
    with pytest.raises(ValidationError):
        proto.decode_server_frame(up)
    with pytest.raises(ValidationError):
        proto.decode_server_frame('{"type":"handover","deadline_s":-1}')


def test_handover_close_code_is_its_own() -> None:
    codes = [
        proto.CLOSE_UNSUPPORTED_VERSION,
        proto.CLOSE_AUTH_FAILED,
        proto.CLOSE_REGISTRATION_REFUSED,
        proto.CLOSE_REVOKED,
        proto.CLOSE_PROTOCOL_ERROR,
        proto.CLOSE_SUPERSEDED,
        proto.CLOSE_HEARTBEAT_TIMEOUT,
        proto.CLOSE_GOING_AWAY,
    ]
    assert proto.CLOSE_HANDED_OVER == 4011
    assert proto.CLOSE_HANDED_OVER not in codes
