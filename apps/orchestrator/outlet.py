"""What one dispatch writes to the gateway: the SSE response, its chunk writes and their counts.

A chunk goes out through `response.write` (the public API), or, once the response's headers are out,
straight onto the gateway's transport from the node socket's reader (`apps.netio.aiohttp_server`,
the `aiohttp_chunk` fast path) while the gateway keeps up. For a request that can resume on another
node the outlet also keeps every SSE event it wrote (one list append per write; `resume.py` parses
them only at a resume).
"""

from __future__ import annotations

from aiohttp import web

from apps.core.protocol.dispatch import MODEL_REVISION_HEADER, QUEUE_WAIT_HEADER, DispatchRequest
from apps.netio import fastpath
from apps.netio.aiohttp_server import ChunkWriter, chunk_writer
from apps.netio.fastpath import PathMetrics
from apps.orchestrator.streams import ChunkEv, RequestStream


class GatewayOutlet:
    def __init__(
        self, request: web.Request, dreq: DispatchRequest, *, resumable: bool, fast_paths: str
    ) -> None:
        self.request = request
        self._fast_paths = fast_paths  # the `netio_fastpaths` setting
        self.dreq = dreq
        self.response: web.StreamResponse | None = None
        self.chunks = 0  # SSE events written (the usage event counts, [DONE] does not)
        self._direct: ChunkWriter | None = None
        self._writes = 0  # pieces written through `response.write`
        # What went to the gateway, kept only for a request that can be resumed (one append per write).
        self.sent: list[str] | None = [] if resumable else None

    def gateway_gone(self) -> bool:
        transport = self.request.transport
        return transport is None or transport.is_closing()

    async def open(self, node_id: str, queued_s: float, revision: str = "") -> web.StreamResponse:
        headers = {
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "x-request-id": self.dreq.request_id,
            "x-llmfleet-node": node_id,
            QUEUE_WAIT_HEADER: f"{queued_s:.6f}",
        }
        if revision:
            headers[MODEL_REVISION_HEADER] = revision
        response = web.StreamResponse(status=200, headers=headers)
        if self.request.version >= (1, 1):
            response.enable_chunked_encoding()  # explicit: the direct writer frames chunks itself
        await response.prepare(self.request)
        self.response = response
        return response

    def go_direct(self, stream: RequestStream) -> None:
        """After the first write (which also put aiohttp's buffered headers out): the following
        chunks go from the node socket's reader onto the gateway's transport, when the probe allows."""
        assert self.response is not None
        self._direct = chunk_writer(self.request, self.response, switch=self._fast_paths)
        if self._direct is not None:
            stream.sink = self.through

    async def write_chunks(self, first: ChunkEv, stream: RequestStream) -> None:
        """This chunk and every chunk queued behind it in one write: one syscall for all
        of them (a relay that fell behind catches up in one go)."""
        more = stream.take_chunks()
        sent = self.sent
        if sent is not None:
            sent.append(first.delta)
            sent.extend(more)
        if more:
            await self.write((first.delta + "".join(more)).encode())
        else:
            await self.write(first.delta.encode())

    def through(self, delta: str) -> bool:
        """The stream's sink, called from the node socket's reader: one chunk straight onto the
        gateway's transport (`apps.netio.aiohttp_server`), unless the gateway is slow or gone; then
        the chunk is queued and goes out through `write`, in order."""
        direct = self._direct
        data = delta.encode()
        if direct is None or not direct.write(data):
            return False
        sent = self.sent
        if sent is not None:
            sent.append(delta)
        self.chunks += data.count(b"\n\n")
        return True

    async def write(self, data: bytes, *, count: bool = True) -> None:
        assert self.response is not None
        if count:
            self.chunks += data.count(b"\n\n") if not data.startswith(b"data: [DONE]") else 0
        self._writes += 1
        await self.response.write(data)

    def count_paths(self, netio: PathMetrics) -> None:
        """Add this response's pieces to `llmfleet_netio_path_total` (once, at the end)."""
        direct = self._direct.written if self._direct is not None else 0
        netio.served(fastpath.AIOHTTP_CHUNK, fast=direct, fallback=self._writes)
