"""`DirectWriter` and `direct_writer` alone, against a stand-in for uvicorn's request cycle."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from apps.netio.uvicorn_writer import RAW_SEND_KEY, DirectWriter, direct_writer


class Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)


def cycle(**state: Any) -> SimpleNamespace:
    values = {
        "transport": Transport(),
        "flow": SimpleNamespace(write_paused=False),
        "chunked_encoding": True,
        "disconnected": False,
        "response_started": True,
        "response_complete": False,
        **state,
    }
    return SimpleNamespace(**values)


def test_frames_a_chunk_like_uvicorn_and_never_writes_an_empty_one() -> None:
    c = cycle()
    writer = DirectWriter(c)
    assert writer.write(b"data: x\n\n") is True
    assert writer.write(b"") is True  # nothing to send; a zero-length frame would end the body
    assert c.transport.written == [b"9\r\ndata: x\n\n\r\n"]


def test_declines_when_the_client_is_slow_gone_or_the_body_phase_is_over() -> None:
    for state in (
        {"flow": SimpleNamespace(write_paused=True)},
        {"disconnected": True},
        {"response_started": False},
        {"response_complete": True},
        {"chunked_encoding": False},
    ):
        c = cycle(**state)
        assert DirectWriter(c).write(b"x") is False, state
        assert c.transport.written == []


def test_only_uvicorns_httptools_protocol_gets_a_direct_writer() -> None:
    async def plain_send(message: dict[str, Any]) -> None:
        return None

    assert direct_writer({"type": "http"}, switch="on") is None
    assert direct_writer({"type": "http", RAW_SEND_KEY: plain_send}, switch="on") is None
