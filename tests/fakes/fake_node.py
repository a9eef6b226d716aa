"""A scripted GPU node speaking the node protocol over a real WebSocket (aiohttp client).

For the orchestrator's tests and the lead's chaos tests: `await node.connect()` sends
`register` and returns the answer (`RegisterAck` or `RegisterRefused`); server frames
land in `assigns` (a queue), `cancels`, `drains`, `acks`; `wait_for(pred)` waits for a
condition without sleeping. `auto` serves every assignment by itself: `tokens` content
chunks in vLLM's shape, then `done` with usage (or, after a `cancel`, `done` with
`finish_reason: "abort"` and the tokens sent so far). Test code drives it by hand with
`chunk`, `done`, `error`, `heartbeat`, `drained`, and cuts it with `abort()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from apps.core.protocol import node as proto
from apps.core.protocol.openai import sse_event
from apps.core.protocol.vllm import chunk_payload, delta_choice, usage_block


def vllm_chunk(request_id: str, model: str, text: str, finish: str | None = None) -> str:
    return sse_event(
        chunk_payload(f"chatcmpl-{request_id}", model, 1, [delta_choice({"content": text}, finish)])
    ).decode()


def usage_payload(request_id: str, model: str, prompt: int, completion: int) -> str:
    usage = {"usage": usage_block(prompt, completion)}
    return chunk_payload(f"chatcmpl-{request_id}", model, 1, [], usage).decode()


@dataclass
class Auto:
    tokens: int = 3
    prompt_tokens: int = 5
    gate: asyncio.Event | None = None  # when set: wait for it after the first chunk


@dataclass
class FakeNode:
    url: str
    node_id: str
    token: str
    models: list[proto.ModelInfo] = field(
        default_factory=lambda: [proto.ModelInfo(name="m", max_num_seqs=4, max_model_len=4096)]
    )
    gpus: int = 1
    location: str = "onprem"
    version: int = proto.PROTOCOL_VERSION
    in_flight: list[str] = field(default_factory=list)
    auto: Auto | None = None
    heartbeat_every_s: float | None = None  # send heartbeats by itself at this period
    assigns: asyncio.Queue[proto.Assign] = field(default_factory=asyncio.Queue)
    frames: list[proto.ServerFrame] = field(default_factory=list)
    cancels: list[str] = field(default_factory=list)
    acks: list[str] = field(default_factory=list)
    drains: int = 0
    loads: list[str] = field(default_factory=list)
    message_sizes: list[int] = field(default_factory=list)  # frames per message received
    close_code: int | None = None
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    _session: aiohttp.ClientSession | None = None
    _ws: aiohttp.ClientWebSocketResponse | None = None
    _reader: asyncio.Task[None] | None = None
    _cond: asyncio.Condition = field(default_factory=asyncio.Condition)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def connect(self) -> proto.RegisterAck | proto.RegisterRefused | None:
        """Register; None when the server closed without an answer (see `close_code`)."""
        self.closed.clear()
        self.close_code = None
        self._session = self._session or aiohttp.ClientSession()
        self._ws = await self._session.ws_connect(self.url, autoping=True)
        register = proto.Register(
            node_id=self.node_id,
            token=self.token,
            version=self.version,
            gpus=self.gpus,
            models=self.models,
            location="cloud" if self.location == "cloud" else "onprem",
            in_flight=self.in_flight,
        )
        text = proto.encode(register)
        if self.version != proto.PROTOCOL_VERSION:
            data = json.loads(text)
            data["version"] = self.version
            text = json.dumps(data)
        await self._ws.send_str(text)
        msg = await self._ws.receive()
        if msg.type != aiohttp.WSMsgType.TEXT:
            await self._finish_close()
            return None
        answer = proto.decode_server_frame(msg.data)
        if isinstance(answer, proto.RegisterAck):
            self._reader = asyncio.create_task(self._read())
            if self.heartbeat_every_s is not None:
                task = asyncio.create_task(self._beat(self.heartbeat_every_s))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            return answer
        await self._ws.receive()  # the close that follows a refusal
        await self._finish_close()
        return answer if isinstance(answer, proto.RegisterRefused) else None

    async def _finish_close(self) -> None:
        assert self._ws is not None
        self.close_code = self._ws.close_code
        await self._ws.close()
        self.closed.set()

    async def _read(self) -> None:
        assert self._ws is not None
        try:
            async for msg in self._ws:
                if msg.type != aiohttp.WSMsgType.TEXT:
                    break
                texts = proto.split_frames(msg.data)
                self.message_sizes.append(len(texts))
                for text in texts:
                    await self._on_frame(proto.decode_server_frame(text))
        finally:
            self.close_code = self._ws.close_code
            self.closed.set()
            async with self._cond:
                self._cond.notify_all()

    async def _on_frame(self, frame: proto.ServerFrame) -> None:
        async with self._cond:
            self.frames.append(frame)
            if isinstance(frame, proto.Assign):
                self.assigns.put_nowait(frame)
                if self.auto is not None:
                    task = asyncio.create_task(self._serve(frame, self.auto))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
            elif isinstance(frame, proto.Cancel):
                self.cancels.append(frame.request_id)
            elif isinstance(frame, proto.DoneAck):
                self.acks.append(frame.request_id)
            elif isinstance(frame, proto.Drain):
                self.drains += 1
            elif isinstance(frame, proto.LoadModel):
                self.loads.append(frame.name)
            self._cond.notify_all()

    def _cancelled(self, request_id: str) -> bool:
        return request_id in self.cancels

    async def _beat(self, period: float) -> None:
        while not self.closed.is_set():
            try:
                await self.heartbeat()
            except (ConnectionError, RuntimeError):
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.closed.wait(), period)

    async def _serve(self, assign: proto.Assign, auto: Auto) -> None:
        sent = 0
        try:
            for i in range(auto.tokens):
                if assign.request_id in self.cancels:
                    break
                await self.chunk(assign.request_id, vllm_chunk(assign.request_id, assign.model, f"t{i}"))
                sent += 1
                if i == 0 and auto.gate is not None:
                    rid = assign.request_id
                    gate = asyncio.ensure_future(auto.gate.wait())
                    cancelled = asyncio.ensure_future(
                        self.wait_for(functools.partial(self._cancelled, rid), 30)
                    )
                    await asyncio.wait({gate, cancelled}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
                    gate.cancel()
                    cancelled.cancel()
                    await asyncio.gather(gate, cancelled, return_exceptions=True)
            aborted = assign.request_id in self.cancels
            await self.done(
                assign.request_id,
                auto.prompt_tokens,
                sent,
                finish_reason="abort" if aborted else "stop",
                usage_event=None
                if aborted
                else usage_payload(assign.request_id, assign.model, auto.prompt_tokens, sent),
            )
        except (ConnectionError, RuntimeError):
            return  # the socket went away under us: that is what some tests do

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        async def waiter() -> None:
            async with self._cond:
                await self._cond.wait_for(lambda: predicate() or self.closed.is_set())

        await asyncio.wait_for(waiter(), timeout)
        if not predicate():
            raise AssertionError("the connection closed before the condition held")

    async def send(self, frame: proto._Frame) -> None:
        assert self._ws is not None
        await self._ws.send_str(proto.encode(frame))

    async def send_batch(self, frames: list[proto._Frame]) -> None:
        """Several frames in one message (protocol version 2)."""
        assert self._ws is not None
        await self._ws.send_str(proto.join_frames([proto.encode(f) for f in frames]))

    async def heartbeat(self, **kw: Any) -> None:
        await self.send(proto.Heartbeat(**{"queue_depth": 0, "kv_cache_usage": 0.0, **kw}))

    async def chunk(self, request_id: str, delta: str) -> None:
        await self.send(proto.Chunk(request_id=request_id, delta=delta))

    async def done(self, request_id: str, prompt_tokens: int, completion_tokens: int, **kw: Any) -> None:
        await self.send(
            proto.Done(
                request_id=request_id, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, **kw
            )
        )

    async def error(
        self, request_id: str, status: int = 500, message: str = "engine failed", **kw: Any
    ) -> None:
        await self.send(proto.Error(request_id=request_id, status=status, message=message, **kw))

    async def drained(self) -> None:
        await self.send(proto.Drained())

    async def abort(self) -> None:
        """Cut the connection like a network failure would (no close handshake)."""
        if self._ws is not None:
            transport = self._ws._response.connection.transport if self._ws._response.connection else None
            if transport is not None:
                transport.abort()
        await self.closed.wait()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._ws is not None and not self._ws.closed:
            await self._ws.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None
