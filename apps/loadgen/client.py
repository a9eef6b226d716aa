"""One streamed chat request, timed from outside: a light SSE reader, no OpenAI SDK.

aiohttp does the HTTP; events are cut with `apps.core.protocol.openai.SseSplitter` and classified
by byte checks, never a full JSON parse, except the final usage chunk. A "token chunk" is any
choices chunk other than the role chunk; TTFT is the time to the first one, ITL the gaps between
them, and the output token count comes from the usage chunk when the stream carries one.

`sent_at` and `first_content_at` are absolute `time.monotonic()` readings, comparable with those
of other processes on the same machine (an engine's timing log, `apps/loadgen/transit.py`).
"""

from __future__ import annotations

import asyncio
import enum
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from apps.core.protocol.openai import DONE_PAYLOAD, SseSplitter, is_error_event, is_usage_event, parse_usage


class Outcome(enum.Enum):
    OK = "ok"
    ERROR = "error"
    ABANDONED = "abandoned"


@dataclass
class RequestResult:
    outcome: Outcome
    status: str  # HTTP status as text, "connect", "timeout", "stream_error" or "incomplete"
    start: float  # monotonic time the request was due (its arrival)
    end: float
    ttft_s: float | None = None
    itls_s: list[float] = field(default_factory=list)
    token_chunks: int = 0
    usage_completion_tokens: int | None = None
    prompt_tokens: int | None = None
    error: str | None = None
    user: str | None = None  # the body's `user` tag, when the run is tagged
    sent_at: float | None = None  # monotonic time the request was handed to aiohttp (>= start)
    first_content_at: float | None = None  # monotonic time the first token chunk arrived

    @property
    def client_ttft_s(self) -> float | None:
        """TTFT from when the request was sent (not when it was due): what the engine's TTFT is
        subtracted from to get the transit time."""
        if self.sent_at is None or self.first_content_at is None:
            return None
        return self.first_content_at - self.sent_at

    @property
    def output_tokens(self) -> int:
        return self.usage_completion_tokens if self.usage_completion_tokens is not None else self.token_chunks

    @property
    def e2e_s(self) -> float:
        return self.end - self.start


def _is_token_chunk(payload: bytes) -> bool:
    return b'"delta"' in payload and b'"role"' not in payload


def _note_event(result: RequestResult, payload: bytes) -> bool:
    """Record one SSE event of the stream in `result`; True when it was a token chunk (counted; its
    timing is the caller's)."""
    if payload == DONE_PAYLOAD:
        result.outcome = Outcome.OK if result.error is None else Outcome.ERROR
    elif is_error_event(payload):
        result.status = "stream_error"
        result.error = payload[:300].decode(errors="replace")
    elif is_usage_event(payload):
        usage = parse_usage(payload)
        if usage is not None:
            result.usage_completion_tokens = usage.completion_tokens
            result.prompt_tokens = usage.prompt_tokens
    elif _is_token_chunk(payload):
        result.token_chunks += 1
        return True
    return False


async def stream_one(
    session: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    body: dict[str, Any],
    start: float,
    abandon_after: int | None = None,
    timeout_s: float = 300.0,
) -> RequestResult:
    """Send one streaming request; `start` is when it was due (open loop: its scheduled arrival)."""
    user = body.get("user")
    result = RequestResult(
        Outcome.ERROR, "incomplete", start, start, user=user if isinstance(user, str) else None
    )
    last: float | None = None
    splitter = SseSplitter()
    try:
        result.sent_at = time.monotonic()
        async with session.post(
            url, json=body, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s, sock_connect=10)
        ) as resp:
            result.status = str(resp.status)
            if resp.status != 200:
                text = await resp.text(errors="replace")
                result.error = text[:300]
                result.end = time.monotonic()
                return result
            async for data in resp.content.iter_any():
                now = time.monotonic()
                for payload in splitter.feed(data):
                    if not _note_event(result, payload):
                        continue
                    if last is None:
                        result.ttft_s = now - start
                        result.first_content_at = now
                    else:
                        result.itls_s.append(now - last)
                    last = now
                    if abandon_after is not None and result.token_chunks >= abandon_after:
                        resp.close()  # drop the connection mid-stream, like a client that goes away
                        result.outcome = Outcome.ABANDONED
                        result.end = time.monotonic()
                        return result
            if result.outcome is not Outcome.OK and result.status == "200":
                result.status = "incomplete"  # the stream ended without [DONE]
                result.error = result.error or "stream ended without [DONE]"
    except TimeoutError:
        result.status, result.error = "timeout", f"no complete answer within {timeout_s} s"
    except aiohttp.ClientConnectorError as exc:
        result.status, result.error = "connect", str(exc)
    except (aiohttp.ClientError, ConnectionError) as exc:
        if result.status == "200":
            result.status = "incomplete"
        result.error = f"{type(exc).__name__}: {exc}"
    except asyncio.CancelledError:
        result.end = time.monotonic()
        raise
    result.end = time.monotonic()
    return result
