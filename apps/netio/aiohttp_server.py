"""Writing relayed chunks of an aiohttp `StreamResponse` straight onto the request's transport.

The orchestrator relays each node's chunk to the gateway from the node socket's reader: through
aiohttp's public API that is one `await response.write()` per chunk in the relay task (a task
wake-up per chunk, per stream). `ChunkWriter.write` instead frames the chunk exactly as aiohttp's
chunked `StreamWriter` does (`<hex len>\\r\\n<data>\\r\\n`) and writes it on `request.transport`,
synchronously, from the reader's callback. It declines (False: the caller queues the chunk and
writes it with `response.write`, in order) when the gateway is slow (`protocol.writing_paused`)
or gone, and it never raises into the caller: a transport or protocol that does not behave as
probed disables the writer for the rest of the response.

Used only for a prepared, chunked, uncompressed response whose headers are out (the caller wrote
its first chunk through `response.write`). `chunk_writer` probes the attributes it relies on
(`tests/unit/test_netio_contract.py` checks them against the installed aiohttp). Switch:
`fastpath.AIOHTTP_CHUNK`.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from apps.netio import fastpath

log = logging.getLogger("llmfleet.netio.aiohttp_server")


class ChunkWriter:
    __slots__ = ("_protocol", "_request", "broken", "written")

    def __init__(self, request: web.BaseRequest, protocol: Any) -> None:
        self._request = request
        self._protocol = protocol
        self.broken = False
        self.written = 0  # pieces this writer put on the transport

    def write(self, data: bytes) -> bool:
        """True when `data` went out as one chunk (an empty `data` writes nothing); False when the
        caller must write it through `response.write`."""
        if self.broken:
            return False
        transport = self._request.transport
        try:
            if transport is None or transport.is_closing() or self._protocol.writing_paused:
                return False
            if data:  # an empty chunk frame would end the response body
                transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        except Exception:
            self.broken = True
            log.warning("direct chunk write failed; the response continues through aiohttp", exc_info=True)
            return False
        self.written += 1
        return True


def chunk_writer(
    request: web.BaseRequest, response: web.StreamResponse, *, switch: str
) -> ChunkWriter | None:
    """A `ChunkWriter` for `response` when the probe passes and the fast path is on under `switch`
    (the app's `netio_fastpaths` setting), else None."""
    if not fastpath.enabled(fastpath.AIOHTTP_CHUNK, switch):
        return None
    if not response.prepared or not response.chunked or response.compression:
        return None
    protocol = request.protocol
    transport = request.transport
    if transport is None or not isinstance(getattr(protocol, "writing_paused", None), bool):
        return None
    if not callable(getattr(transport, "write", None)) or not callable(
        getattr(transport, "is_closing", None)
    ):
        return None
    return ChunkWriter(request, protocol)
