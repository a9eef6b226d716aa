"""The console in-process (httpx ASGI) on real PostgreSQL and Redis: sessions, CSRF, scoping, bad input."""

from __future__ import annotations

import asyncio
import json
import re
import time
from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg
import pytest

from apps.core.db.migrate import MIGRATIONS_DIR
from apps.core.nodes import keys
from apps.core.protocol import bus
from apps.gateway.slo import Reading, SloStatus, indicators
from tests.gateway_env import GatewayEnv
from tests.integration.console_client import signin, signin_csrf_of
from tests.integration.gateway_fixtures import gateway
from tests.utcdays import utc_days

__all__ = ["gateway"]  # the fixture, imported for pytest

MODEL = "llama-3.1-8b-instruct"
MARKUP = '<script>alert("x")</script>&team'


@pytest.fixture
def env(gateway: GatewayEnv) -> GatewayEnv:
    return gateway


def browser(env: GatewayEnv, scheme: str = "http") -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=env.app), base_url=f"{scheme}://gw")


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "no CSRF token on the page"
    return found.group(1)


HI = [{"role": "user", "content": "hi"}]


async def chat(env: GatewayEnv, key: str) -> None:
    """One request of exactly 4 completion tokens (`ignore_eos`), settled before this returns."""
    async with browser(env) as c:
        r = await c.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": HI, "max_tokens": 4, "ignore_eos": True},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert r.status_code == 200, r.text
    await env.settled()


async def test_team_sign_in_sets_a_safe_cookie_and_shows_usage(env: GatewayEnv) -> None:
    _, key = await env.team_with_key("alpha")
    await chat(env, key)
    p = await env.fleet.prompt_tokens(HI)
    async with browser(env) as c:
        r = await signin(c, env.issuer.mint("alice", team="alpha"))
        assert r.status_code == 303
        assert r.headers["location"] == "/console/team"
        cookie = r.headers["set-cookie"].lower()
        assert "httponly" in cookie
        assert "samesite=lax" in cookie
        assert "path=/console" in cookie
        assert "secure" not in cookie  # plain HTTP: a Secure cookie would never come back
        page = await c.get("/console/team")
        assert page.status_code == 200
        assert "content-security-policy" in page.headers
        # The engine's prompt count (none cached) + 4 completion tokens, in the usage table and the
        # chart data.
        assert f"<td>{MODEL}</td><td>1</td><td>{p}</td><td>0</td><td>4</td><td>{p + 4}</td>" in page.text
        assert f'"tokens": [{p + 4}' in page.text or '"tokens": [0' in page.text
        csv = await c.get("/console/team/usage.csv")
        assert csv.headers["content-type"].startswith("text/csv")
        assert f",{MODEL},1,{p},0,4,{p + 4}," in csv.text


async def test_cookie_is_secure_behind_tls(env: GatewayEnv) -> None:
    await env.team_with_key("alpha")
    async with browser(env, "https") as c:
        r = await signin(c, env.issuer.mint("alice", team="alpha"))
        assert "secure" in r.headers["set-cookie"].lower()


async def test_markup_in_a_key_name_is_escaped(env: GatewayEnv) -> None:
    # Team names are validated ([A-Za-z0-9._-], issue 21); key names are free text.
    await env.team_with_key("mallory-team")
    await env.deps.keys.create(team="mallory-team", name=MARKUP)
    async with browser(env) as c:
        await signin(c, env.issuer.mint("mallory", team="mallory-team"))
        page = (await c.get("/console/team")).text
    assert MARKUP not in page
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&amp;team" in page
    async with browser(env) as c:
        await signin(c, env.admin_token)
        admin = (await c.get("/console/admin")).text
    assert "<script>alert" not in admin
    assert "&lt;script&gt;" in admin


async def test_a_second_team_cannot_see_or_revoke_the_first_teams_keys(env: GatewayEnv) -> None:
    await env.team_with_key("alpha")
    key_a, _ = await env.deps.keys.create(team="alpha", name="alpha-secret-key")
    await chat(env, key_a)
    await env.team_with_key("beta")
    key_a_id = next(k.id for k in await env.deps.keys.list_keys("alpha") if k.name == "alpha-secret-key")
    async with browser(env) as c:
        await signin(c, env.issuer.mint("bob", team="beta"))
        page = await c.get("/console/team")
        assert "alpha-secret-key" not in page.text
        assert MODEL + "</td><td>1" not in page.text
        assert f"<td>1</td><td>{await env.fleet.prompt_tokens(HI)}</td>" not in page.text
        r = await c.post(f"/console/team/keys/{key_a_id}/revoke", data={"csrf": csrf_of(page.text)})
        assert r.status_code == 404
        assert "has no key" in r.text
        assert (await c.get("/console/admin")).headers["location"] == "/console/signin"
        # The URL cannot pick another team either: the team id comes from the session only.
        assert "alpha-secret-key" not in (await c.get("/console/team?team=1&team_id=1")).text
    assert all(k.revoked_at is None for k in await env.deps.keys.list_keys("alpha"))
    await chat(env, key_a)


async def test_state_changes_need_the_sessions_csrf_token(env: GatewayEnv) -> None:
    await env.team_with_key("alpha")
    await env.team_with_key("beta")
    async with browser(env) as other:
        await signin(other, env.issuer.mint("bob", team="beta"))
        foreign = csrf_of((await other.get("/console/team")).text)
    async with browser(env) as c:
        await signin(c, env.issuer.mint("alice", team="alpha"))
        before = len(await env.deps.keys.list_keys("alpha"))
        for data in ({"name": "x"}, {"name": "x", "csrf": foreign}, {"name": "x", "csrf": "forged"}):
            r = await c.post("/console/team/keys", data=data)
            assert r.status_code == 403
            assert "did not come from this console" in r.text
        assert len(await env.deps.keys.list_keys("alpha")) == before


async def test_create_key_shows_the_secret_once_and_revoke_locks_it_out(env: GatewayEnv) -> None:
    await env.team_with_key("alpha")
    async with browser(env) as c:
        await signin(c, env.issuer.mint("alice", team="alpha"))
        csrf = csrf_of((await c.get("/console/team")).text)
        r = await c.post("/console/team/keys", data={"csrf": csrf, "name": "ci", "model": MODEL, "rpm": "60"})
        assert r.status_code == 201
        secret = re.search(r'<code id="new-key">(sk-lf-[^<]+)</code>', r.text)
        assert secret
        assert secret.group(1) not in (await c.get("/console/team")).text
        await chat(env, secret.group(1))
        new = next(k for k in await env.deps.keys.list_keys("alpha") if k.name == "ci")
        assert new.model_allowlist == (MODEL,)
        assert new.rpm == 60
        r = await c.post(f"/console/team/keys/{new.id}/revoke", data={"csrf": csrf})
        assert r.status_code == 200
        assert f"Key {new.id} revoked" in r.text
    async with browser(env) as api:
        r = await api.get("/v1/models", headers={"Authorization": f"Bearer {secret.group(1)}"})
        assert r.status_code == 401


async def test_key_scoped_session_reads_only_its_key_and_changes_nothing(env: GatewayEnv) -> None:
    await env.team_with_key("alpha", credits=10**9)
    key1, _ = await env.deps.keys.create(team="alpha", name="one")
    secret2, _ = await env.deps.keys.create(team="alpha", name="two")
    await chat(env, key1)
    async with browser(env) as c:
        await signin(c, secret2)
        page = await c.get("/console/team")
        assert ">two<" in page.text
        assert ">one<" not in page.text
        # Key one's request is not this key's usage.
        assert f"<td>1</td><td>{await env.fleet.prompt_tokens(HI)}</td>" not in page.text
        r = await c.post("/console/team/keys", data={"csrf": csrf_of(page.text), "name": "x"})
        assert r.status_code == 403
        k2 = next(k for k in await env.deps.keys.list_keys("alpha") if k.name == "two")
        await env.deps.keys.revoke(k2.id)
        assert (await c.get("/console/team")).headers["location"] == "/console/signin"


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("from=2026-03-10&to=2026-03-01", "the range is empty"),
        ("from=2020-01-01&to=2026-01-01", "the range is too long"),
        ("from=yesterday", "must be a date"),
        ("model=gpt-4o", "unknown model"),
    ],
)
async def test_bad_ranges_and_filters_get_a_message(env: GatewayEnv, query: str, message: str) -> None:
    await env.team_with_key("alpha")
    async with browser(env) as c:
        await signin(c, env.issuer.mint("alice", team="alpha"))
        r = await c.get(f"/console/team?{query}")
        assert r.status_code == 400
        assert message in r.text.lower()
        assert 'id="error"' in r.text
        assert (await c.get(f"/console/team/usage.csv?{query}")).status_code == 400


async def test_admin_adds_credits_and_bad_amounts_change_nothing(env: GatewayEnv) -> None:
    team_id, _ = await env.team_with_key("alpha", credits=5_000_000)
    async with browser(env) as c:
        r = await signin(c, env.admin_token)
        assert r.headers["location"] == "/console/admin"
        csrf = csrf_of((await c.get("/console/admin")).text)
        for amount, message in (
            ("-5", "must be a positive"),
            ("abc", "must be a number"),
            ("0", "must be a positive"),
        ):
            r = await c.post(
                "/console/admin/credits", data={"csrf": csrf, "team": str(team_id), "amount": amount}
            )
            assert r.status_code == 400
            assert message in r.text, r.text
        assert (await env.deps.teams.get_team(team_id)).balance_microcredits == 5_000_000
        r = await c.post("/console/admin/credits", data={"csrf": csrf, "team": str(team_id), "amount": "2.5"})
        assert r.status_code == 200
        assert "Added 2.5 credits" in r.text
        assert '<td class="balance">7.5</td>' in r.text
    assert (await env.deps.teams.get_team(team_id)).balance_microcredits == 7_500_000


async def test_team_session_cannot_act_as_admin(env: GatewayEnv) -> None:
    team_id, _ = await env.team_with_key("alpha", credits=1_000_000)
    async with browser(env) as c:
        await signin(c, env.issuer.mint("alice", team="alpha"))
        csrf = csrf_of((await c.get("/console/team")).text)
        r = await c.post("/console/admin/credits", data={"csrf": csrf, "team": str(team_id), "amount": "100"})
        assert r.status_code == 303
    assert (await env.deps.teams.get_team(team_id)).balance_microcredits == 1_000_000


async def test_a_jti_token_signs_in_once_whichever_way_it_arrives(env: GatewayEnv) -> None:
    """Issue 27: the one-use link's token could be reused by POSTing it to /console/signin."""
    await env.team_with_key("alpha")
    token = env.issuer.mint("alice", team="alpha", extra={"jti": "link-1"})
    async with browser(env) as c:
        r = await signin(c, token)
        assert r.status_code == 303
        assert "lf_console=" in r.headers["set-cookie"]
    async with browser(env) as c:
        r = await signin(c, token)
        assert r.status_code == 401
        assert "already used" in r.text
        assert "lf_console=" not in r.headers.get("set-cookie", "")
        assert (await c.get("/console/team")).headers["location"] == "/console/signin"


async def test_sign_out_revokes_the_session_and_its_csrf_token_everywhere(env: GatewayEnv) -> None:
    """Issue 27: a saved cookie kept working after sign-out, and its CSRF token still created keys."""
    await env.team_with_key("alpha")
    async with browser(env) as c:
        await signin(c, env.issuer.mint("alice", team="alpha"))
        saved = c.cookies.get("lf_console", path="/console")
        assert saved
        csrf = csrf_of((await c.get("/console/team")).text)
        r = await c.post("/console/signout", data={"csrf": csrf})
        assert r.status_code == 303
    before = len(await env.deps.keys.list_keys("alpha"))
    async with browser(env) as replay:
        replay.cookies.set("lf_console", saved, path="/console")
        assert (await replay.get("/console/team")).headers["location"] == "/console/signin"
        r = await replay.post("/console/team/keys", data={"csrf": csrf, "name": "after-signout"})
        assert r.status_code == 303
        assert r.headers["location"] == "/console/signin"
    assert len(await env.deps.keys.list_keys("alpha")) == before


async def test_sign_in_refuses_cross_site_posts_and_forms_without_its_token(env: GatewayEnv) -> None:
    """Issue 27 (login CSRF): a cross-site POST signed the victim into the attacker's session."""
    await env.team_with_key("alpha")
    token = env.issuer.mint("mallory", team="alpha")
    async with browser(env) as c:
        form = signin_csrf_of((await c.get("/console/signin")).text)
        cases: list[tuple[dict[str, str], dict[str, str]]] = [
            ({"token": token}, {}),  # no form token
            ({"token": token, "signin_csrf": "forged"}, {}),
            ({"token": token, "signin_csrf": form}, {"sec-fetch-site": "cross-site"}),
            ({"token": token, "signin_csrf": form}, {"sec-fetch-site": "same-site"}),
            ({"token": token, "signin_csrf": form}, {"origin": "https://evil.example"}),
            ({"token": token, "signin_csrf": form}, {"origin": "null", "sec-fetch-site": "cross-site"}),
        ]
        for data, headers in cases:
            r = await c.post("/console/signin", data=data, headers=headers)
            assert r.status_code == 403, (data, headers)
            assert "did not come from this console" in r.text
            assert "lf_console=" not in r.headers.get("set-cookie", "")
        async with browser(env) as stranger:  # another browser's form token is not this one's
            r = await stranger.post("/console/signin", data={"token": token, "signin_csrf": form})
            assert r.status_code == 403
        form = signin_csrf_of((await c.get("/console/signin")).text)  # a refusal renders a new form
        ok = await c.post(
            "/console/signin",
            data={"token": token, "signin_csrf": form},
            headers={"sec-fetch-site": "same-origin", "origin": "http://gw"},
        )
        assert ok.status_code == 303


async def test_a_token_in_the_url_is_never_accepted(env: GatewayEnv) -> None:
    """Issue 27: `GET /console/signin?token=sk-lf-...` signed in (the key lands in logs and history)."""
    _, key = await env.team_with_key("alpha")
    async with browser(env) as c:
        for token in (key, env.issuer.mint("alice", team="alpha")):
            r = await c.get("/console/signin", params={"token": token})
            assert r.status_code == 400
            assert "not accepted in the address" in r.text
            assert "lf_console=" not in r.headers.get("set-cookie", "")
            assert token not in r.text
            assert (await c.get("/console/team")).headers["location"] == "/console/signin"


async def test_bad_token_and_forged_cookie_get_no_session(env: GatewayEnv) -> None:
    async with browser(env) as c:
        r = await signin(c, "sk-lf-nope")
        assert r.status_code == 401
        assert "Sign-in failed" in r.text
        c.cookies.set("lf_console", "eyJraW5kIjoiYWRtaW4ifQ.forged", path="/console")
        assert (await c.get("/console/admin")).headers["location"] == "/console/signin"


async def _published(pubsub: Any) -> dict[str, Any]:
    """The next message published on `pubsub`'s channels (its subscribe confirmation skipped)."""
    async with asyncio.timeout(5):
        while True:
            message = await pubsub.get_message(timeout=1.0)
            if message is not None and message["type"] == "message":
                return dict(message)


async def test_admin_drains_a_node(env: GatewayEnv) -> None:
    """Against the real node store: the drain goes out on the node's channel, where the replica that
    owns its socket listens (a subscriber stands in for that replica here)."""
    await env.deps.nodes.issue_token("n1", "cloud")
    owner = env.redis.pubsub()
    await owner.subscribe(keys.node_channel("n1", namespace=env.settings.channel_namespace))
    try:
        async with browser(env) as c:
            await signin(c, env.admin_token)
            csrf = csrf_of((await c.get("/console/admin")).text)
            r = await c.post("/console/admin/nodes/n1/drain", data={"csrf": csrf})
            assert r.status_code == 200
            assert "Drain requested for n1." in r.text
            message = await _published(owner)
            assert bus.decode_node_message(message["data"]) == bus.DrainMsg()
            csv = (await c.get("/console/admin/capacity.csv")).text.splitlines()
            assert csv[0].startswith("model,ready_nodes,streams_available")
            # n1 serves no model: a model no other node serves has no capacity (the 8B has the fleet's node).
            assert any(line.startswith("qwen2.5-32b-instruct,0,0,") for line in csv)
            await owner.unsubscribe()  # the replica let the socket go
            r = await c.post("/console/admin/nodes/n1/drain", data={"csrf": csrf})
            assert r.status_code == 409
            assert "not connected" in r.text
    finally:
        await owner.aclose()


async def test_pages_load_only_same_origin_assets(env: GatewayEnv) -> None:
    await env.team_with_key("alpha")
    async with browser(env) as c:
        r = await c.get("/console/")
        assert r.status_code == 303
        assert r.headers["location"] == "/console/signin"
        await signin(c, env.issuer.mint("alice", team="alpha"))
        page = (await c.get("/console/team")).text
        sources = re.findall(r'(?:src|href)="([^"]+)"', page)
        assert sources
        assert all(s.startswith(("/console/", "#")) for s in sources), sources
        for asset in ("uPlot.iife.min.js", "uPlot.min.css", "console.js", "uPlot.LICENSE"):
            assert (await c.get(f"/console/static/{asset}")).status_code == 200


async def test_the_team_view_shows_its_refusals_by_reason_and_no_other_teams(env: GatewayEnv) -> None:
    _, key = await env.team_with_key("alpha", rpm=1)
    await env.team_with_key("beta")
    started = datetime.now(UTC)
    await chat(env, key)
    async with browser(env) as c:
        refused = await c.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert refused.status_code == 429
        await signin(c, env.issuer.mint("alice", team="alpha"))
        page = await c.get("/console/team")
        # "today" is the UTC day the page is rendered on: 0 on a run that crossed midnight UTC.
        today = "1" if len(utc_days(started)) == 1 else "[01]"
        assert re.search(
            '<td class="status">429</td><td class="reason">rpm</td>'
            f'<td class="today">{today}</td><td class="week">1</td>',
            page.text,
        ), page.text
    async with browser(env) as c:
        await signin(c, env.issuer.mint("bob", team="beta"))
        page = await c.get("/console/team")
        assert 'id="refusals-table"' in page.text
        assert "None in the last 7 days." in page.text


class StaticSlo:
    def __init__(self, status: SloStatus) -> None:
        self._status = status

    async def status(self) -> SloStatus:
        return self._status


async def test_admin_view_shows_slo_status_or_says_prometheus_is_not_configured(env: GatewayEnv) -> None:
    per_model, attainment = indicators(env.deps.spec)
    ttft_p95 = next(i for i in per_model if i.title == "TTFT p95")
    async with browser(env) as c:
        await signin(c, env.admin_token)
        page = await c.get("/console/admin")
        assert "Prometheus is not configured (set LLMFLEET_PROMETHEUS_URL)." in page.text
        env.deps.slo = StaticSlo(
            SloStatus(
                models=[Reading(ttft_p95, {"model": MODEL}, 4.2)],
                teams=[Reading(attainment, {"team": MARKUP, "model": MODEL}, 0.5)],
                alerts=[
                    {
                        "alertname": "LlmfleetTtftP95High",
                        "severity": "critical",
                        "model": MODEL,
                        "summary": "s",
                    }
                ],
            )
        )
        page = await c.get("/console/admin")
        assert page.status_code == 200
        assert '<td class="value">4.2 s</td>' in page.text
        assert '<td class="value">50.0%</td>' in page.text
        assert page.text.count('<td class="slo-state">missed</td>') == 2
        assert "<td>LlmfleetTtftP95High</td>" in page.text
        assert MARKUP not in page.text  # a label from Prometheus is escaped like everything else
        env.deps.slo = StaticSlo(SloStatus(error="Prometheus at http://p did not answer (timed out)."))
        page = await c.get("/console/admin")
        assert page.status_code == 200
        assert "did not answer (timed out)" in page.text


async def test_the_team_view_shows_its_queue_share_from_the_fair_queues_board(env: GatewayEnv) -> None:
    alpha, key = await env.team_with_key("alpha")
    beta, _ = await env.team_with_key("beta")
    now = time.time()
    lanes = [
        {"class": "interactive", "team_id": alpha, "waiting": 3, "oldest_wait_s": 1.5},
        {"class": "batch", "team_id": alpha, "waiting": 1, "oldest_wait_s": 4.0},
        {"class": "interactive", "team_id": beta, "waiting": 6, "oldest_wait_s": 0.5},
    ]
    await env.redis.hset(f"fair:svc:{MODEL}", mapping={str(alpha): 300.0, str(beta): 100.0})
    await env.redis.hset(f"fair:q:{MODEL}", mapping={"orch-a": json.dumps({"at": now, "lanes": lanes})})
    async with browser(env) as c:
        await signin(c, env.issuer.mint("alice", team="alpha"))
        page = await c.get("/console/team")
        row = page.text[page.text.index(f'<tr><td>{MODEL}</td><td class="waiting">') :].split("</tr>")[0]
        assert '<td class="waiting">4 / 10</td><td>4.0</td>' in row
        assert '<td class="served-share">75.0%</td>' in row
    async with browser(env) as c:  # a key-scoped session sees no team-wide queue data
        await signin(c, key)
        assert 'id="share-table"' not in (await c.get("/console/team")).text


async def test_a_team_creates_keys_only_of_the_classes_the_admin_allows(env: GatewayEnv) -> None:
    """Issue 27: a team whose keys are meant to be batch created interactive keys for itself."""
    await env.team_with_key("alpha")
    async with browser(env) as admin:
        for bad in ([], ["gold"], "batch"):
            r = await admin.post(
                "/admin/teams/sharing",
                json={"team": "alpha", "priority_classes": bad},
                headers=env.admin_headers(),
            )
            assert r.status_code == 400, bad
            assert r.json()["error"]["param"] == "priority_classes"
        r = await admin.post(
            "/admin/teams/sharing",
            json={"team": "alpha", "priority_classes": ["batch"]},
            headers=env.admin_headers(),
        )
        assert r.status_code == 200, r.text
        assert r.json()["priority_classes"] == ["batch"]
    before = len(await env.deps.keys.list_keys("alpha"))
    async with browser(env) as c:
        await signin(c, env.issuer.mint("alice", team="alpha"))
        page = (await c.get("/console/team")).text
        assert '<option value="batch">' in page
        assert '<option value="interactive">' not in page  # the form offers only what is allowed
        form = {"csrf": csrf_of(page), "name": "sneaky", "priority_class": "interactive"}
        r = await c.post("/console/team/keys", data=form)
        assert r.status_code == 403
        assert "may not create" in r.text
        assert len(await env.deps.keys.list_keys("alpha")) == before
        r = await c.post("/console/team/keys", data={"csrf": csrf_of(page), "name": "plain"})
        assert r.status_code == 201, r.text
    created = next(k for k in await env.deps.keys.list_keys("alpha") if k.name == "plain")
    assert created.priority_class.value == "batch"
    # A new team gets both classes unless the admin says otherwise (today's behaviour kept).
    async with browser(env) as admin:
        r = await admin.post("/admin/teams", json={"name": "gamma"}, headers=env.admin_headers())
        assert r.json()["priority_classes"] == ["interactive", "batch"]
        r = await admin.post(
            "/admin/teams", json={"name": "delta", "priority_classes": ["batch"]}, headers=env.admin_headers()
        )
        assert r.status_code == 201
        assert r.json()["priority_classes"] == ["batch"]


async def test_the_admin_reads_team_names_where_metrics_carry_ids(env: GatewayEnv) -> None:
    """Issue 27: metrics label teams by id; the admin's SLO table shows the name beside it."""
    alpha, _ = await env.team_with_key("alpha")
    _, attainment = indicators(env.deps.spec)
    env.deps.slo = StaticSlo(
        SloStatus(teams=[Reading(attainment, {"team": str(alpha), "model": MODEL}, 0.99)])
    )
    async with browser(env) as c:
        await signin(c, env.admin_token)
        page = (await c.get("/console/admin")).text
    assert f'<td class="slo-team">alpha ({alpha})</td>' in page


async def test_a_team_sees_its_own_waiting_count_and_the_total_only(env: GatewayEnv) -> None:
    """Issue 27: a team's console must not show other teams' waiting counts per model."""
    alpha, _ = await env.team_with_key("alpha")
    beta, _ = await env.team_with_key("beta")
    gamma, _ = await env.team_with_key("gamma")
    lanes = [
        {"class": "interactive", "team_id": alpha, "waiting": 2, "oldest_wait_s": 1.0},
        {"class": "interactive", "team_id": beta, "waiting": 37, "oldest_wait_s": 9.25},
        {"class": "batch", "team_id": gamma, "waiting": 53, "oldest_wait_s": 7.75},
    ]
    await env.redis.hset(
        f"fair:q:{MODEL}", mapping={"orch-a": json.dumps({"at": time.time(), "lanes": lanes})}
    )
    async with browser(env) as c:
        await signin(c, env.issuer.mint("alice", team="alpha"))
        page = (await c.get("/console/team")).text
    table = page[page.index('id="share-table"') :].split("</table>")[0]
    assert f'<tr><td>{MODEL}</td><td class="waiting">2 / 92</td><td>1.0</td>' in table  # own oldest wait
    for other in ("37", "53", "9.2", "7.8", "beta", "gamma"):
        assert other not in table, other
    assert f"team {beta}" not in page
    assert f"team {gamma}" not in page


def test_migrations_0009_and_0010_apply_twice_and_keep_their_checks(migrated_db_url: str) -> None:
    with psycopg.connect(migrated_db_url, autocommit=True) as conn:
        for name in ("0009_console_sessions.sql", "0010_team_priority_classes.sql"):
            conn.execute((MIGRATIONS_DIR / name).read_text(encoding="utf-8").encode())  # again: no error
        row = conn.execute("INSERT INTO teams (name) VALUES ('m10') RETURNING priority_classes").fetchone()
        assert row == (["interactive", "batch"],)  # existing and new teams keep both classes
        for bad in ("{}", "{gold}", "{batch,gold}"):
            with pytest.raises(psycopg.errors.CheckViolation):
                conn.execute("UPDATE teams SET priority_classes = %s WHERE name = 'm10'", (bad,))
