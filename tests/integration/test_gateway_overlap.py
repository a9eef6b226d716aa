"""Admission and reservation run concurrently for keys with headroom, in order otherwise
(`apps.gateway.speculation`), against real PostgreSQL and Redis; and a reused request id."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from apps.core.quota.admission import Limits
from tests.gateway_env import GatewayEnv
from tests.integration.gateway_fixtures import client, gateway

__all__ = ["gateway"]  # the fixture, imported for pytest

pytestmark = pytest.mark.timeout(60)

MODEL = "llama-3.1-8b-instruct"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture
def env(gateway: GatewayEnv) -> GatewayEnv:
    return gateway


async def key_id(env: GatewayEnv) -> int:
    async with env.pool.connection() as conn:
        row = await (await conn.execute("SELECT max(id) FROM api_keys")).fetchone()
    assert row is not None
    return int(row[0])


async def ledger(env: GatewayEnv) -> tuple[list[tuple[str, str]], int, int]:
    async with env.pool.connection() as conn:
        rows = await (
            await conn.execute("SELECT request_id, status::text FROM usage_ledger ORDER BY id")
        ).fetchall()
        team = await (
            await conn.execute("SELECT balance_microcredits, reserved_microcredits FROM teams")
        ).fetchone()
    assert team is not None
    return [(str(r[0]), str(r[1])) for r in rows], int(team[0]), int(team[1])


def metric(text: str, line_start: str) -> float:
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_overlap_after_a_first_answer_and_a_wasted_reservation_is_cancelled(env: GatewayEnv) -> None:
    _, key = await env.team_with_key("a", rpm=3)
    kid = await key_id(env)
    headers = {"Authorization": f"Bearer {key}"}
    async with client(env) as c:
        first = await c.post(
            "/v1/chat/completions", json=BODY, headers={**headers, "x-request-id": "req-first-1"}
        )
        assert first.status_code == 200
        await env.settled()  # the orchestrator settles the first from its node's report
        _, balance_after_first, _ = await ledger(env)
        # Another replica spends the rest of the rpm window: this replica still believes 2 are left.
        now_ms = int(time.time() * 1000)
        await env.redis.zadd(f"rl:{kid}:rpm", {"other-1": now_ms, "other-2": now_ms})
        refused = await c.post(
            "/v1/chat/completions", json=BODY, headers={**headers, "x-request-id": "req-second"}
        )
        again = await c.post(
            "/v1/chat/completions", json=BODY, headers={**headers, "x-request-id": "req-third1"}
        )
        text = (await c.get("/metrics")).text
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rpm"
    assert again.status_code == 429
    rows, balance, reserved = await ledger(env)
    # The overlapped reservation was made and cancelled; the next request ran in order (headroom 0)
    # and never reached PostgreSQL.
    # Internally a client's id is scoped by its team (team 1 here): `t1/<x-request-id>`.
    assert rows == [("t1/req-first-1", "settled"), ("t1/req-second", "cancelled")]
    assert (balance, reserved) == (balance_after_first, 0)
    assert metric(text, "llmfleet_gateway_overlap_wasted_reservations_total") == 1
    assert metric(text, 'llmfleet_gateway_checks_seconds_count{mode="in_order"}') == 2
    assert metric(text, 'llmfleet_gateway_checks_seconds_count{mode="overlapped"}') == 1
    assert await env.redis.scard(f"streams:{kid}") == 0


async def test_a_key_without_limits_overlaps_and_a_402_gives_the_slot_back(env: GatewayEnv) -> None:
    _, key = await env.team_with_key("poor", credits=0)
    async with client(env) as c:
        r = await c.post("/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {key}"})
        text = (await c.get("/metrics")).text
    assert r.status_code == 402
    assert metric(text, 'llmfleet_gateway_checks_seconds_count{mode="overlapped"}') == 1
    assert metric(text, 'llmfleet_gateway_rejections_total{reason="insufficient_balance"}') == 1
    kid = await key_id(env)
    assert await env.redis.scard(f"streams:{kid}") == 0  # the admitted slot was given back


async def test_when_both_refuse_the_admission_refusal_is_the_answer(env: GatewayEnv) -> None:
    _, key = await env.team_with_key("poor", credits=0, rpm=3)
    kid = await key_id(env)
    headers = {"Authorization": f"Bearer {key}"}
    async with client(env) as c:
        assert (await c.post("/v1/chat/completions", json=BODY, headers=headers)).status_code == 402
        now_ms = int(time.time() * 1000)
        await env.redis.zadd(f"rl:{kid}:rpm", {"other-1": now_ms, "other-2": now_ms})
        r = await c.post("/v1/chat/completions", json=BODY, headers=headers)
        text = (await c.get("/metrics")).text
    assert r.status_code == 429  # as in order: the cheaper check's refusal wins
    assert r.json()["error"]["code"] == "rpm"
    # One reason per refused request: the first request's 402, the second's 429 (not also a 402).
    assert metric(text, 'llmfleet_gateway_rejections_total{reason="insufficient_balance"}') == 1
    assert metric(text, 'llmfleet_gateway_rejections_total{reason="rpm"}') == 1
    assert metric(text, 'llmfleet_gateway_checks_seconds_count{mode="overlapped"}') == 1
    rows, _, reserved = await ledger(env)
    assert rows == []
    assert reserved == 0


@pytest.mark.parametrize("limits", [{}, {"max_streams": 3}], ids=["overlapped", "in_order"])
async def test_reusing_a_running_request_id_is_400_and_keeps_the_running_slot(
    env: GatewayEnv, limits: dict[str, int]
) -> None:
    team_id, key = await env.team_with_key("a", **limits)
    kid = await key_id(env)
    # A stream with this id is running: it holds a slot and a reservation.
    scoped = f"t{team_id}/req-running"  # the internal id of the client's `req-running`
    running = await env.deps.quota.admit(str(kid), scoped, Limits(**limits), env.deps.clock())
    assert running.admitted
    await env.deps.ledger.reserve(
        request_id=scoped,
        team_id=team_id,
        key_id=kid,
        model=MODEL,
        estimated_prompt_tokens=8,
        max_tokens=4,
    )
    async with client(env) as c:
        r = await c.post(
            "/v1/chat/completions",
            json=BODY,
            headers={"Authorization": f"Bearer {key}", "x-request-id": "req-running"},
        )
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "duplicate_request_id"
    assert r.json()["error"]["param"] == "x-request-id"
    # The running stream still holds its slot (a duplicate must not free it: that would let a
    # client exceed max_streams) and its reservation.
    assert await env.redis.sismember(f"streams:{kid}", scoped)
    rows, _, reserved = await ledger(env)
    assert rows == [(scoped, "reserved")]
    assert reserved > 0
    assert env.dispatcher.requests == []


class GatedLedger:
    """The real ledger, with `reserve` held at a gate (to cancel the request while it is in flight)."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    async def reserve(self, **kwargs: Any) -> Any:
        self.entered.set()
        await self.gate.wait()
        return await self._real.reserve(**kwargs)


@pytest.mark.parametrize(
    ("limits", "warm", "landed"),
    [({}, False, True), ({"max_streams": 3}, True, True), ({"max_streams": 3}, False, False)],
    ids=["overlapped-no-limits", "overlapped-after-an-answer", "in-order"],
)
async def test_a_request_cancelled_while_its_reservation_is_in_flight_leaks_nothing(
    env: GatewayEnv, limits: dict[str, int], warm: bool, landed: bool
) -> None:
    """The client goes away while the checks run. Overlapped, the reservation is its own task and
    commits after the cancellation: it is cancelled once it lands, and the slot is given back. In
    order, the reservation is cancelled before it starts. Nothing is dispatched either way."""
    team_id, key = await env.team_with_key("a", **limits)
    kid = await key_id(env)
    headers = {"Authorization": f"Bearer {key}", "x-request-id": "req-cancelled"}
    cancelled, warmed = f"t{team_id}/req-cancelled", f"t{team_id}/req-warm-1"  # internal, team-scoped
    if warm:  # a first answer on record: the next request of this limited key overlaps
        async with client(env) as c:
            warm_headers = headers | {"x-request-id": "req-warm-1"}
            assert (await c.post("/v1/chat/completions", json=BODY, headers=warm_headers)).status_code == 200
    gated = GatedLedger(env.deps.ledger)
    env.deps.ledger = gated  # type: ignore[assignment]  # a wrapper with the same interface
    async with client(env) as c:
        request = asyncio.ensure_future(c.post("/v1/chat/completions", json=BODY, headers=headers))
        async with asyncio.timeout(10):
            await gated.entered.wait()
        request.cancel()
        gated.gate.set()  # an overlapped reservation commits after the client is gone
        with pytest.raises(asyncio.CancelledError):
            await request
    rows, _, reserved = await ledger(env)
    assert ((cancelled, "cancelled") in rows) is landed
    assert (cancelled, "reserved") not in rows
    assert reserved == 0
    assert await env.redis.scard(f"streams:{kid}") == 0
    assert [r.request_id for r in env.dispatcher.requests] == ([warmed] if warm else [])
