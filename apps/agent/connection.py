"""One WebSocket connection to the orchestrator: the register handshake and the writer.

One reader (in `agent.py`) and one writer per connection; every frame to the
orchestrator goes through a bounded queue, so a slow link pushes back on the relays
instead of buffering without limit. When the connection ends, `close()` releases
every sender that waits on a full queue (its frame is dropped: chunks of a dead
connection are useless, dones are in the journal and replayed on the next one).
"""

from __future__ import annotations

import asyncio
import logging
import socket

import aiohttp
from pydantic import ValidationError

from apps.core.aio import first_of, won
from apps.core.protocol import node as proto

log = logging.getLogger("llmfleet.agent.connection")

_BATCH_MAX = 512
_MESSAGE_MAX = proto.MESSAGE_MAX_CHARS  # per batched message (the orchestrator accepts 8 MiB)
_TCP_CORK: int | None = getattr(socket, "TCP_CORK", None)


class RegistrationFailed(Exception):
    """The orchestrator did not accept our `register` (refusal, close code, or no answer)."""

    def __init__(
        self, reason: str, retry_after_s: float | None = None, close_code: int | None = None
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s
        self.close_code = close_code


class ConnectionLost(Exception):
    def __init__(self, close_code: int | None, reason: str = "") -> None:
        super().__init__(f"connection lost (close code {close_code}) {reason}".strip())
        self.close_code = close_code


_CLOSE_REASONS = {
    proto.CLOSE_UNSUPPORTED_VERSION: "protocol version not supported by the orchestrator",
    proto.CLOSE_AUTH_FAILED: "node token rejected",
    proto.CLOSE_REVOKED: "node token revoked",
    proto.CLOSE_REGISTRATION_REFUSED: "registration rate limited",
    proto.CLOSE_SUPERSEDED: "the same node_id registered elsewhere",
    proto.CLOSE_PROTOCOL_ERROR: "protocol error",
}


def close_reason(code: int | None) -> str:
    return _CLOSE_REASONS.get(code or 0, f"closed by the orchestrator (code {code})")


async def register(
    ws: aiohttp.ClientWebSocketResponse, frame: proto.Register, timeout_s: float
) -> proto.RegisterAck:
    """Send `register` and wait for `register_ack`; anything else raises `RegistrationFailed`."""
    await ws.send_str(proto.encode(frame))
    try:
        msg = await ws.receive(timeout=timeout_s)
    except TimeoutError as exc:
        raise RegistrationFailed(f"no register_ack within {timeout_s:g} s") from exc
    if msg.type == aiohttp.WSMsgType.TEXT:
        try:
            answer = proto.decode_server_frame(msg.data)
        except ValidationError as exc:
            raise RegistrationFailed("unreadable answer to register") from exc
        if isinstance(answer, proto.RegisterAck):
            return answer
        if isinstance(answer, proto.RegisterRefused):
            raise RegistrationFailed(answer.reason, answer.retry_after_s)
        raise RegistrationFailed(f"unexpected {answer.type} before register_ack")
    code = ws.close_code if msg.type != aiohttp.WSMsgType.CLOSE else int(msg.data)
    retry_after = None
    if msg.type == aiohttp.WSMsgType.CLOSE and isinstance(msg.extra, str):
        # A server may put the hint in the close reason ("retry_after_s=2.5").
        key = "retry_after_s="
        if msg.extra.startswith(key):
            try:
                retry_after = float(msg.extra[len(key) :])
            except ValueError:
                retry_after = None
    raise RegistrationFailed(close_reason(code), retry_after, close_code=code)


def _not_urgent(item: tuple[bool, str]) -> bool:
    return not item[0]


class Connection:
    def __init__(
        self,
        ws: aiohttp.ClientWebSocketResponse,
        queue_size: int,
        *,
        batching: bool = False,
        version: int = 1,
    ) -> None:
        self.ws = ws
        self.version = version  # the protocol version this connection registered with
        # Protocol version 2: a batch goes out as one message, its frames one per line.
        self.batching = batching
        # (urgent, text): an urgent frame (a request's first chunk) leads the batch it is sent in.
        self._queue: asyncio.Queue[tuple[bool, str]] = asyncio.Queue(maxsize=queue_size)
        self._closed = asyncio.Event()
        self.retiring = False  # handed over: serves only the requests that came on it

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    async def send(self, frame: proto._Frame, *, urgent: bool = False) -> bool:
        """Queue one frame; False if the connection is gone (the frame is dropped). An `urgent`
        frame (a request's chunks up to its first token) goes out ahead of the non-urgent frames
        queued with it (never ahead of another urgent one), so time to first token does not wait
        behind a whole engine step's worth of other requests' chunks."""
        if self._closed.is_set():
            return False
        text = (urgent, proto.encode(frame))
        try:
            self._queue.put_nowait(text)
            return True
        except asyncio.QueueFull:
            pass
        # Slow path, only under backpressure: wait for room or for the end of the connection.
        put, _ = await first_of(self._queue.put(text), self._closed.wait())
        return won(put)

    async def flush(self, timeout_s: float) -> None:
        """Wait (bounded) until the writer has sent everything queued so far."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._queue.join()
        except TimeoutError:
            log.warning("send queue not flushed in time", extra={"queued": self._queue.qsize()})

    async def writer(self) -> None:
        while True:
            batch = [await self._queue.get()]
            # Every frame queued meanwhile (one engine step queues one chunk per running
            # request) goes out together: as one message (version 2), or corked (version 1):
            # one TCP segment for the batch instead of one each, so the orchestrator is woken
            # and reads once per batch.
            while len(batch) < _BATCH_MAX and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            if len(batch) > 1:
                batch.sort(key=_not_urgent)  # stable: order within each class is kept
            texts = [text for _, text in batch]
            messages = proto.batch_messages(texts, _MESSAGE_MAX) if self.batching else texts
            corked = len(messages) > 1 and self._cork(True)
            try:
                for text in messages:
                    await self.ws.send_str(text)
            except (ConnectionError, aiohttp.ClientError) as exc:
                raise ConnectionLost(self.ws.close_code, "send failed") from exc
            finally:
                if corked:
                    self._cork(False)
                for _ in batch:
                    self._queue.task_done()

    def _cork(self, on: bool) -> bool:
        """TCP_CORK on the socket (Linux); False where unavailable (the frames still go out)."""
        sock = self.ws.get_extra_info("socket")
        if sock is None or _TCP_CORK is None:
            return False
        try:
            sock.setsockopt(socket.IPPROTO_TCP, _TCP_CORK, 1 if on else 0)
        except OSError:
            return False
        return True

    async def wait_closed(self) -> None:
        """Until the connection has ended (the orchestrator closed it, or it was lost)."""
        await self._closed.wait()

    def close(self) -> None:
        self._closed.set()
