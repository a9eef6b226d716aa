"""A zero-latency fake orchestrator behind the gateway's `Dispatcher` Protocol.

Produces vLLM-like SSE chunks (role chunk, one content chunk per token, finish chunk,
usage chunk only when the client wants it, `[DONE]`) and settles the ledger through
`settle_usage` exactly like the orchestrator: full usage at the end, the tokens produced
so far when the gateway closes early.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from apps.core.error_table import UPSTREAM_ERROR, stream_error
from apps.core.errors import Unavailable
from apps.core.ledger.api import Ledger
from apps.core.metering import settle_usage
from apps.core.protocol.dispatch import DispatchRequest
from apps.core.protocol.openai import SSE_DONE, sse_event
from apps.core.protocol.vllm import chunk_payload, delta_choice, usage_block


class FakeUpstream:
    def __init__(self, owner: FakeDispatcher, request: DispatchRequest) -> None:
        self._owner = owner
        self._req = request
        self.status = owner.status
        self.headers: Mapping[str, str] = {"x-llmfleet-queue-wait": "0.25"}
        if owner.status != 200:
            self.headers = {**self.headers, "retry-after": "3"}
        self.tokens = owner.tokens if owner.tokens is not None else (request.budget.max_tokens or 8)
        self.prompt_tokens = 11
        self.produced = 0
        self._settled = False
        self._closed = False

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse_event(
            chunk_payload(
                self._req.request_id, self._req.model, int(time.time()), [delta_choice(delta, finish)]
            )
        )

    async def chunks(self) -> AsyncIterator[bytes]:
        self._owner.running += 1
        self._owner.max_running = max(self._owner.max_running, self._owner.running)
        try:
            if self._owner.gate is not None:
                await self._owner.gate.wait()
            yield self._chunk({"role": "assistant", "content": ""})
            for i in range(self.tokens):
                if self._owner.delay_s:
                    await asyncio.sleep(self._owner.delay_s)
                self.produced += 1
                if self._owner.die_after is not None and i >= self._owner.die_after:
                    yield stream_error(UPSTREAM_ERROR, "engine died")
                    await self._settle()
                    return
                yield self._chunk({"content": f"t{i} "})
            yield self._chunk({}, "length" if self._owner.tokens is None else "stop")
            if self._req.client_wants_usage:
                usage = {"usage": usage_block(self.prompt_tokens, self.produced)}
                yield sse_event(
                    chunk_payload(self._req.request_id, self._req.model, int(time.time()), [], usage)
                )
            await self._settle()
            yield SSE_DONE
        finally:
            self._owner.running -= 1

    async def read_body(self) -> bytes:
        if self._owner.error is not None:
            return json.dumps(self._owner.error).encode()
        return json.dumps(Unavailable("no healthy node", code="no_node").envelope()).encode()

    async def _settle(self) -> None:
        if self._settled:
            return
        self._settled = True
        if self.status != 200:
            await self._owner.ledger.cancel(self._req.request_id)
            return
        if self._owner.redis is None:
            await self._owner.ledger.settle(self._req.request_id, self.prompt_tokens, self.produced)
            return
        await settle_usage(
            self._owner.ledger, self._owner.redis, self._req.request_id, self.prompt_tokens, self.produced
        )

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._owner.closed += 1
        # Like the real orchestrator (another process), settlement after a disconnect does not run
        # inside the gateway's bounded cleanup: it is a task of its own.
        task = asyncio.create_task(self._settle())
        self._owner.settling.add(task)
        task.add_done_callback(self._owner.settling.discard)


class FakeDispatcher:
    def __init__(
        self,
        ledger: Ledger,
        redis: Any,
        *,
        tokens: int | None = None,
        delay_s: float = 0.0,
        status: int = 200,
        gate: asyncio.Event | None = None,
        die_after: int | None = None,
        error: dict[str, Any] | None = None,
    ) -> None:
        self.ledger = ledger
        self.redis = redis
        self.tokens = tokens
        self.delay_s = delay_s
        self.status = status
        self.gate = gate
        self.die_after = die_after
        self.error = error  # the error body a non-200 answer carries (default: a 503 `no_node`)
        self.requests: list[DispatchRequest] = []
        self.running = 0
        self.max_running = 0
        self.closed = 0
        self.settling: set[asyncio.Task[None]] = set()

    async def open(self, request: DispatchRequest) -> FakeUpstream:
        self.requests.append(request)
        return FakeUpstream(self, request)

    async def aclose(self) -> None:
        return None
