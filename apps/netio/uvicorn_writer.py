"""Writing relayed chunks straight to the client's socket, without an ASGI `send` per chunk.

The relay's steady state is "one upstream read -> one client write" 10,000 times a second at
200 streams. Through ASGI that is a task wake-up, three coroutine frames (Starlette's two
middleware wrappers and uvicorn's `send`) and a message dict per chunk. When the server is
uvicorn's httptools protocol, the response is chunked and the client is keeping up, a chunk can
instead be framed and written to uvicorn's transport from the upstream's `data_received`:
exactly the bytes uvicorn's own `send` would write (`<hex len>\\r\\n<data>\\r\\n`).

Everything else still goes through ASGI: the status line and headers (so uvicorn decides on
chunked encoding and keep-alive), the terminating chunk, error events, and any chunk written
while the client is slow (`flow.write_paused`, where `send` waits for the drain) or gone. A
server that is not uvicorn's httptools protocol gets no `DirectWriter` and every chunk takes the
ASGI path; `direct_writer` checks for the attributes it relies on instead of a version number
(`tests/unit/test_netio_contract.py` checks them against the installed uvicorn). Switch:
`fastpath.UVICORN_CHUNK`.

`GatewayApp` (the Starlette app) records the server's own `send` in the scope under
`RAW_SEND_KEY`, before any middleware wraps it.
"""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.types import Receive, Scope, Send

from apps.netio import fastpath

RAW_SEND_KEY = "llmfleet.raw_send"
_UVICORN_HTTPTOOLS = "uvicorn.protocols.http.httptools_impl"
_NEEDED = ("transport", "flow", "chunked_encoding", "disconnected", "response_started", "response_complete")


class GatewayApp(Starlette):
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[RAW_SEND_KEY] = send
        await super().__call__(scope, receive, send)


class DirectWriter:
    """Writes one chunk of a started, chunked response to uvicorn's transport, or declines."""

    __slots__ = ("_cycle", "_flow", "_transport")

    def __init__(self, cycle: Any) -> None:
        self._cycle = cycle
        self._flow = cycle.flow
        self._transport = cycle.transport

    def write(self, data: bytes) -> bool:
        """True when `data` went out as one chunk; False when the caller must use ASGI `send`
        (client slow or gone, response not in the chunked body phase)."""
        cycle = self._cycle
        if (
            cycle.disconnected
            or self._flow.write_paused
            or not cycle.response_started
            or cycle.response_complete
            or cycle.chunked_encoding is not True
        ):
            return False
        if data:  # an empty chunk frame would end the response body
            self._transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        return True


def direct_writer(scope: Scope, *, switch: str) -> DirectWriter | None:
    """A `DirectWriter` for this request when the server is uvicorn's httptools protocol (and the
    fast path is on under `switch`, the app's `netio_fastpaths` setting); None: every chunk goes
    through ASGI `send`."""
    if not fastpath.enabled(fastpath.UVICORN_CHUNK, switch):
        return None
    send = scope.get(RAW_SEND_KEY)
    cycle = getattr(send, "__self__", None)
    if cycle is None or type(cycle).__module__ != _UVICORN_HTTPTOOLS:
        return None
    if not all(hasattr(cycle, name) for name in _NEEDED) or not hasattr(cycle.flow, "write_paused"):
        return None
    return DirectWriter(cycle)
