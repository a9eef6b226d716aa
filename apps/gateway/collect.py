"""A non-streaming answer: the whole upstream stream read into one JSON body (a chat completion's
or a completion's chunks assembled; an embeddings answer's one event as it is).

Bound to the client connection like a stream: a client that leaves stops the request upstream (the
orchestrator cancels it on the node and settles the tokens produced so far). The whole request runs
within the maximum request time (its stream slot's lease), the first chunk within the first-token
deadline and each later one within the idle deadline.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from starlette.types import Receive

from apps.core.aio import first_of
from apps.core.errors import UpstreamFailed
from apps.core.protocol.assemble import ASSEMBLERS
from apps.core.protocol.openai import SseSplitter
from apps.gateway.ports import Upstream
from apps.gateway.relay import RelayOutcome


@dataclass(frozen=True)
class Timeouts:
    first_token_s: float
    idle_s: float
    max_request_s: float


async def client_gone(receive: Receive) -> None:
    """Returns when the client disconnects (the request body has been read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def collect(
    upstream: Upstream, outcome: RelayOutcome, receive: Receive, timeouts: Timeouts, endpoint: str = "chat"
) -> dict[str, Any] | None:
    """The assembled answer, or None when the client left first (`outcome.ended` says how it
    ended either way)."""
    reader, _ = await first_of(read_completion(upstream, outcome, timeouts, endpoint), client_gone(receive))
    if not reader.done():
        outcome.ended = "disconnect"
        await asyncio.wait({reader})
        return None
    body: dict[str, Any] = reader.result()
    return body


async def read_completion(
    upstream: Upstream, outcome: RelayOutcome, timeouts: Timeouts, endpoint: str = "chat"
) -> dict[str, Any]:
    payloads: list[bytes] = []
    splitter = SseSplitter()
    try:
        chunks = upstream.chunks()
        deadline = timeouts.first_token_s
        # The whole request within the maximum request time, like a stream (its slot's lease).
        async with asyncio.timeout(timeouts.max_request_s):
            while True:
                try:
                    async with asyncio.timeout(deadline):
                        data = await anext(chunks)
                except StopAsyncIteration:
                    break
                deadline = timeouts.idle_s
                if outcome.first_byte_at is None:
                    outcome.first_byte_at = time.monotonic()
                payloads.extend(splitter.feed(data))
        body = ASSEMBLERS[endpoint](payloads)
    except TimeoutError:
        outcome.ended = "timeout"
        raise UpstreamFailed("upstream timed out") from None
    except (OSError, ValueError) as exc:
        outcome.ended = "upstream_error"
        raise UpstreamFailed(f"upstream failed: {exc}") from None
    outcome.ended = "done"
    return body
