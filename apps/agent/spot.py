"""Spot reclaim: the interruption notice starts the drain, with a budget that fits the notice.

EC2 announces a Spot reclaim about two minutes ahead at the instance metadata service:
`GET /latest/meta-data/spot/instance-action` answers 404 until then, then
`{"action": "terminate", "time": "2026-12-01T16:02:00Z"}` (IMDSv2: with a session token from
`PUT /latest/api/token`; without one when the service allows IMDSv1). The agent polls it
(`--spot-notice-url`, off by default) and drains with `deadline = time - now - handoff_s`:
streams that finish in that budget finish here; the rest are handed off when it runs out (an
`error` of type `node_draining`, which the orchestrator resumes on another node), leaving
`handoff_s` for the other node to take them over before this one goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import aiohttp

log = logging.getLogger("llmfleet.agent.spot")

_ACTIONS = frozenset({"terminate", "stop", "hibernate"})
_TOKEN_TTL_S = "21600"


def drain_budget(notice: Any, now: datetime, handoff_s: float) -> float | None:
    """Seconds to drain for, from an instance-action document; None when it is not a notice."""
    if not isinstance(notice, dict) or notice.get("action") not in _ACTIONS:
        return None
    try:
        at = datetime.fromisoformat(str(notice["time"]).replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return max(0.0, (at - now).total_seconds() - handoff_s)


async def _token(session: aiohttp.ClientSession, url: str, timeout_s: float) -> str | None:
    base, sep, _ = url.partition("/latest/")
    if not sep:
        return None
    with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
        async with session.put(
            f"{base}/latest/api/token",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": _TOKEN_TTL_S},
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            if resp.status == 200:
                return await resp.text()
    return None


async def fetch_notice(session: aiohttp.ClientSession, url: str, timeout_s: float = 2.0) -> Any:
    """The instance-action document, or None (no notice yet, or the service did not answer)."""
    token = await _token(session, url, timeout_s)
    headers = {"X-aws-ec2-metadata-token": token} if token else {}
    with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError, ValueError):
        async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status == 200:
                return await resp.json(content_type=None)
    return None


async def watch(
    session: aiohttp.ClientSession,
    url: str,
    *,
    poll_s: float,
    handoff_s: float,
    on_notice: Callable[[float], None],
    stop: asyncio.Event,
    wall: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> None:
    """Poll until a notice (then call `on_notice(budget)` once and return) or until `stop`."""
    while not stop.is_set():
        budget = drain_budget(await fetch_notice(session, url), wall(), handoff_s)
        if budget is not None:
            log.warning("spot interruption notice: draining", extra={"deadline_s": round(budget, 1)})
            on_notice(budget)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), poll_s)
