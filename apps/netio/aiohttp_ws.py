"""Writing one WebSocket text message synchronously on aiohttp's client WebSocket writer.

The agent sends a request's first chunk from the engine socket's callback, not one event-loop
turn later from its writer task (that turn comes only after the loop ran every other stream's
relay of the same engine step). aiohttp's public `send_str` is a coroutine; its `WebSocketWriter`
frames and writes an uncompressed message without awaiting anything, through
`_write_websocket_frame(message, opcode, rsv)`. `frame_writer` probes that method's signature,
the writer's `_closing`/`compress`, its protocol's `_paused` and its transport
(`tests/unit/test_netio_contract.py` checks them against the installed aiohttp); anything else
(another aiohttp, compression, the switch `fastpath.AIOHTTP_WS_FRAME` off) gives None and every
frame goes through the writer task. The returned function declines (False, nothing written) while
the socket is closing or paused and never raises: a writer that fails is disabled.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

import aiohttp

from apps.netio import fastpath

log = logging.getLogger("llmfleet.netio.aiohttp_ws")

_SIGNATURE = ["message", "opcode", "rsv"]  # WebSocketWriter._write_websocket_frame, aiohttp 3.13-3.14


def frame_writer(ws: aiohttp.ClientWebSocketResponse) -> Callable[[str], bool] | None:
    """A synchronous `write(text) -> bool` for `ws`, or None (use `await ws.send_str`)."""
    if not fastpath.enabled(fastpath.AIOHTTP_WS_FRAME):
        return None
    writer: Any = getattr(ws, "_writer", None)
    write_frame = getattr(writer, "_write_websocket_frame", None)
    protocol: Any = getattr(writer, "protocol", None)
    transport = getattr(writer, "transport", None)
    if write_frame is None or transport is None or not hasattr(protocol, "_paused"):
        return None
    try:
        if list(inspect.signature(write_frame).parameters) != _SIGNATURE:
            return None
    except (TypeError, ValueError):
        return None
    if getattr(writer, "compress", 1) or getattr(writer, "_closing", True):
        return None
    broken = False

    def write(text: str) -> bool:
        nonlocal broken
        if broken:
            return False
        try:
            if ws.closed or writer._closing or transport.is_closing() or protocol._paused:
                return False
            write_frame(text.encode(), aiohttp.WSMsgType.TEXT, 0)
        except Exception:
            broken = True
            log.warning("direct frame write failed; frames go through the writer task", exc_info=True)
            return False
        return True

    return write
