"""`GET/PUT/DELETE /admin/teams/{team_id}/guardrails` against real PostgreSQL, with a real admin JWT
(local issuer, JWKS): admin only, 404 for a team that does not exist, 400 with `param` for a bad
policy (nothing written), and the saved policy is what the request path then reads.

The routes are mounted in a small Starlette app of their own (the same error mapping as the gateway's),
so these tests need no platform behind the gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response

from apps.core.errors import LlmfleetError
from apps.core.guardrails.store import GuardrailStore
from apps.core.identity.jwt_verify import JwtVerifier
from apps.core.identity.local_issuer import LocalIssuer
from apps.core.ledger.teams import TeamStore
from apps.core.spec import load_spec
from apps.gateway.deps import GatewayDeps
from apps.gateway.errors import error_response
from apps.gateway.guardrail_routes import GuardrailAdminApi
from apps.gateway.settings import GatewaySettings
from tests.fakes.fake_node_admin import FakeNodeAdmin
from tests.fakes.fake_stores import FakeKeys, FakeQuota, StaticHealth
from tests.fakes.static_resolver import StaticResolver

pytestmark = pytest.mark.timeout(60)

POLICY: dict[str, Any] = {
    "input": [{"detector": "ssn", "action": "block"}, {"detector": "mrn", "action": "redact"}],
    "output": [{"detector": "email", "action": "redact"}],
    "patterns": [{"name": "mrn", "pattern": "MRN[0-9]{6}"}],
    "guard_model": {"model": "llama-3.1-8b-instruct"},
}


@dataclass
class Env:
    client: httpx.AsyncClient
    issuer: LocalIssuer
    teams: TeamStore
    store: GuardrailStore
    pool: AsyncConnectionPool
    jwks_url: str

    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.issuer.mint('ops', admin=True)}"}


async def on_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, LlmfleetError)
    return error_response(exc)


def app(
    pool: AsyncConnectionPool, jwks_url: str, issuer: LocalIssuer, store: GuardrailStore | None
) -> Starlette:
    deps = GatewayDeps(
        spec=load_spec("dev"),
        ledger=None,  # neither is used by the admin routes
        teams=TeamStore(pool),
        keys=FakeKeys(),
        quota=FakeQuota(),
        dispatcher=None,
        nodes=FakeNodeAdmin(),
        health=StaticHealth(),
        resolver=StaticResolver(),
        jwt=JwtVerifier(jwks_url, issuer=issuer.issuer, audience=issuer.audience),
    )
    routes = GuardrailAdminApi(GatewaySettings(secret_key="test-secret"), deps, store).routes()
    return Starlette(routes=routes, exception_handlers={LlmfleetError: on_error})


@pytest.fixture
async def env(migrated_db_url: str) -> AsyncIterator[Env]:
    issuer = LocalIssuer.generate()
    jwks_url = issuer.serve()
    try:
        async with AsyncConnectionPool(migrated_db_url, min_size=1, max_size=4) as pool:
            store = GuardrailStore(pool)
            transport = httpx.ASGITransport(app=app(pool, jwks_url, issuer, store))
            async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
                yield Env(client, issuer, TeamStore(pool), store, pool, jwks_url)
    finally:
        issuer.stop()


def path(team_id: object) -> str:
    return f"/admin/teams/{team_id}/guardrails"


async def test_an_admin_saves_reads_and_removes_a_teams_policy(env: Env) -> None:
    team = await env.teams.create_team("claims")
    r = await env.client.get(path(team.id), headers=env.admin())
    assert (r.status_code, r.json()) == (200, {"team_id": team.id, "policy": None, "updated_at": None})
    r = await env.client.put(path(team.id), json=POLICY, headers=env.admin())
    assert r.status_code == 200, r.text
    saved = r.json()
    assert saved["team_id"] == team.id
    assert saved["updated_at"]
    assert saved["policy"]["patterns"] == POLICY["patterns"]
    assert saved["policy"]["guard_model"]["action"] == "block"  # defaults filled in
    assert (await env.client.get(path(team.id), headers=env.admin())).json() == saved
    compiled = await GuardrailStore(env.pool).compiled(team.id)  # what the request path reads
    assert compiled is not None
    assert [c.name for c in compiled.input] == ["ssn", "mrn"]
    r = await env.client.delete(path(team.id), headers=env.admin())
    assert r.json() == {"team_id": team.id, "deleted": True}
    r = await env.client.delete(path(team.id), headers=env.admin())
    assert r.json() == {"team_id": team.id, "deleted": False}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": [{"detector": "passport", "action": "block"}]}, "input.0.detector"),
        ({"patterns": [{"name": "mrn", "pattern": "(a+)+b"}]}, "patterns.0.pattern"),
        ({"patterns": [{"name": "mrn", "pattern": "(?<=x)y"}]}, "patterns.0.pattern"),
        ({"guard_model": {"model": "bge-m3"}}, "guard_model.model"),  # an embedding model
        ({"output": [{"detector": "ssn", "action": "mask"}]}, "output.0.action"),
        ({"outputs": []}, "outputs"),
    ],
)
async def test_a_bad_policy_is_a_400_naming_the_field_and_writes_nothing(
    env: Env, body: dict[str, Any], param: str
) -> None:
    team = await env.teams.create_team("claims")
    r = await env.client.put(path(team.id), json=body, headers=env.admin())
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert r.json()["error"]["message"].startswith(param)
    assert await env.store.get(team.id) is None


async def test_a_body_that_is_not_a_json_object_is_a_400(env: Env) -> None:
    team = await env.teams.create_team("claims")
    for raw in (b"[]", b"{", b"\xff"):
        r = await env.client.put(path(team.id), content=raw, headers=env.admin())
        assert r.status_code == 400, raw


@pytest.mark.parametrize("team_id", ["999", "0", "\u00b2", "x", "99999999999999999999"])
async def test_a_team_that_does_not_exist_is_a_404(env: Env, team_id: str) -> None:
    for method in ("GET", "PUT", "DELETE"):
        r = await env.client.request(method, path(team_id), json=POLICY, headers=env.admin())
        assert r.status_code == 404, (method, r.text)
        assert r.json()["error"]["code"] == "team_not_found"


async def test_only_an_admin_jwt_may_call_them(env: Env) -> None:
    team = await env.teams.create_team("claims")
    member = env.issuer.mint("u", team="claims")
    for headers, status in (
        ({}, 401),
        ({"Authorization": "Bearer sk-lf-not-a-jwt"}, 403),
        ({"Authorization": f"Bearer {member}"}, 403),
    ):
        for method in ("GET", "PUT", "DELETE"):
            r = await env.client.request(method, path(team.id), json=POLICY, headers=headers)
            assert r.status_code == status, (method, headers, r.text)
    assert await env.store.get(team.id) is None


async def test_a_query_parameter_is_refused(env: Env) -> None:
    team = await env.teams.create_team("claims")
    r = await env.client.get(path(team.id) + "?team=other", headers=env.admin())
    assert (r.status_code, r.json()["error"]["param"]) == (400, "team")


async def test_without_a_store_the_routes_answer_503(env: Env) -> None:
    team = await env.teams.create_team("claims")
    unwired = app(env.pool, env.jwks_url, env.issuer, None)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=unwired), base_url="http://gw") as client:
        r = await client.get(path(team.id), headers=env.admin())
    assert (r.status_code, r.json()["error"]["code"]) == (503, "guardrails_not_configured")
