"""Spot reclaim (apps/agent/spot.py): the notice's budget, and the watcher against a stand-in
metadata service (IMDSv2 token, 404 until the notice, then the instance action)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest
from aiohttp import web

from apps.agent.spot import drain_budget, watch
from tests.fakes.web_server import serve_app

NOW = datetime(2026, 12, 1, 16, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("notice", "expected"),
    [
        ({"action": "terminate", "time": "2026-12-01T16:02:00Z"}, 100.0),  # 120 s notice, 20 s kept
        ({"action": "stop", "time": "2026-12-01T16:00:30+00:00"}, 10.0),
        ({"action": "terminate", "time": "2026-12-01T16:00:05Z"}, 0.0),  # too late: hand off at once
        ({"action": "terminate", "time": "2026-12-01T16:02:00"}, 100.0),  # no zone: UTC
        ({"action": "terminate"}, None),
        ({"action": "terminate", "time": "soon"}, None),
        ({"action": "reboot", "time": "2026-12-01T16:02:00Z"}, None),
        (None, None),
        ([], None),
    ],
)
def test_drain_budget_fits_the_notice(notice: object, expected: float | None) -> None:
    assert drain_budget(notice, NOW, handoff_s=20.0) == expected


async def test_watcher_drains_once_when_the_notice_appears() -> None:
    notice: dict[str, str] = {}
    tokens: list[str] = []
    gets: list[str | None] = []

    async def token(request: web.Request) -> web.Response:
        assert request.headers["X-aws-ec2-metadata-token-ttl-seconds"] == "21600"
        tokens.append("t")
        return web.Response(text="tok-1")

    async def action(request: web.Request) -> web.Response:
        gets.append(request.headers.get("X-aws-ec2-metadata-token"))
        if not notice:
            return web.Response(status=404)
        return web.json_response(notice, content_type="text/plain")  # IMDS answers text/plain

    app = web.Application()
    app.router.add_put("/latest/api/token", token)
    app.router.add_get("/latest/meta-data/spot/instance-action", action)
    budgets: list[float] = []
    stop = asyncio.Event()
    async with serve_app(app) as base, aiohttp.ClientSession() as session:
        task = asyncio.create_task(
            watch(
                session,
                f"{base}/latest/meta-data/spot/instance-action",
                poll_s=0.01,
                handoff_s=20.0,
                on_notice=budgets.append,
                stop=stop,
                wall=lambda: NOW,
            )
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while len(gets) < 2 and loop.time() < deadline:
            await asyncio.sleep(0.01)
        assert budgets == []  # 404: no notice yet
        notice.update(action="terminate", time=(NOW + timedelta(seconds=120)).isoformat())
        await asyncio.wait_for(task, 10)
    assert budgets == [100.0]
    assert set(gets) == {"tok-1"}
    assert tokens


async def test_watcher_stops_with_the_agent() -> None:
    stop = asyncio.Event()
    stop.set()
    async with aiohttp.ClientSession() as session:
        await asyncio.wait_for(
            watch(
                session,
                "http://127.0.0.1:9/latest/meta-data/spot/instance-action",
                poll_s=0.01,
                handoff_s=0,
                on_notice=lambda _: None,
                stop=stop,
            ),
            5,
        )
