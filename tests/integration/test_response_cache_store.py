"""The response cache's store and admin API against real PostgreSQL with pgvector (`vector_db_url`: the
test server when it has the extension, else the embedded one): every read names its team, semantic
matches by cosine similarity within one context, expiry, the per-team size bound, a purge that leaves
old rows unreadable, and the admin routes' errors (admin only, 404, 400 naming the field, 409 without
pgvector)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response

from apps.core.errors import LlmfleetError
from apps.core.identity.jwt_verify import JwtVerifier
from apps.core.identity.local_issuer import LocalIssuer
from apps.core.ledger.teams import TeamStore
from apps.core.respcache.entry import CachedAnswer
from apps.core.respcache.policies import CachePolicyStore
from apps.core.respcache.store import CacheStore, Scope
from apps.core.spec import load_spec
from apps.gateway.cache_routes import CacheAdminApi
from apps.gateway.deps import GatewayDeps
from apps.gateway.errors import error_response
from apps.gateway.settings import GatewaySettings
from tests.fakes.fake_node_admin import FakeNodeAdmin
from tests.fakes.fake_stores import FakeKeys, FakeQuota, StaticHealth
from tests.fakes.static_resolver import StaticResolver

pytestmark = pytest.mark.timeout(60)

SECRET = b"test-secret-key"
MODEL = "llama-3.1-8b-instruct"


def answer(text: str) -> CachedAnswer:
    chunk = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": MODEL}
    chunks = [
        json.dumps({**chunk, "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": "stop"}]})
    ]
    return CachedAnswer("chat", chunks, {"prompt_tokens": 5, "completion_tokens": 3})


def unit(*values: float) -> list[float]:
    norm = sum(v * v for v in values) ** 0.5
    return [v / norm for v in values]


@dataclass
class Env:
    pool: AsyncConnectionPool
    store: CacheStore
    teams: TeamStore

    async def put(
        self, scope: Scope, text: str, exact: bytes, *, vector: list[float] | None = None, **kw: int
    ) -> None:
        key = await self.store.key(scope.team_id)
        await self.store.put(
            scope,
            key,
            answer(text),
            exact_key=exact,
            context_key=b"ctx",
            embedder="bge-m3" if vector is not None else None,
            vector=vector,
            ttl_s=kw.get("ttl_s", 600),
            max_bytes=kw.get("max_bytes", 1 << 20),
        )

    async def exact(self, scope: Scope, exact: bytes) -> str | None:
        found = await self.store.exact(scope, await self.store.key(scope.team_id), exact)
        return None if found is None else json.loads(found.answer.chunks[0])["choices"][0]["delta"]["content"]


@pytest.fixture
async def env(vector_db_url: str) -> AsyncIterator[Env]:
    async with AsyncConnectionPool(vector_db_url, min_size=1, max_size=4) as pool:
        yield Env(pool, CacheStore(pool, SECRET, {MODEL: "r1"}, revision_ttl_s=0.0), TeamStore(pool))


async def test_entries_are_per_team_model_and_revision(env: Env) -> None:
    a, b = (await env.teams.create_team("a")).id, (await env.teams.create_team("b")).id
    await env.put(Scope(a, MODEL, "r1"), "for a", b"same")
    assert await env.exact(Scope(a, MODEL, "r1"), b"same") == "for a"
    assert await env.exact(Scope(b, MODEL, "r1"), b"same") is None
    assert await env.exact(Scope(a, MODEL, "r2"), b"same") is None
    assert await env.exact(Scope(a, "other", "r1"), b"same") is None
    # A row moved to team B (a broken or malicious write) does not open with B's key: it is deleted.
    async with env.pool.connection() as conn:
        await conn.execute("UPDATE response_cache SET team_id = %s WHERE team_id = %s", (b, a))
    assert await env.exact(Scope(b, MODEL, "r1"), b"same") is None
    assert env.store.unsealable == 1
    assert (await env.store.stats(b)).entries == 0


async def test_a_semantic_match_is_the_nearest_entry_above_the_threshold(env: Env) -> None:
    team = (await env.teams.create_team("s")).id
    scope = Scope(team, MODEL, "r1")
    await env.put(scope, "north", b"n", vector=unit(1, 0, 0))
    await env.put(scope, "east", b"e", vector=unit(0, 1, 0))
    key = await env.store.key(team)
    near_north = unit(0.95, 0.1, 0)
    found = await env.store.semantic(scope, key, b"ctx", "bge-m3", near_north, 0.9)
    assert found is not None
    assert json.loads(found.answer.chunks[0])["choices"][0]["delta"]["content"] == "north"
    assert found.similarity == pytest.approx(0.9945, abs=1e-3)
    assert await env.store.semantic(scope, key, b"ctx", "bge-m3", unit(1, 1, 0), 0.9) is None  # 0.71 to both
    assert await env.store.semantic(scope, key, b"other-ctx", "bge-m3", near_north, 0.9) is None
    assert await env.store.semantic(scope, key, b"ctx", "other-embedder", near_north, 0.9) is None
    assert await env.store.semantic(scope, key, b"ctx", "bge-m3", [1.0, 0.0], 0.5) is None  # other dimensions
    assert (await env.store.stats(team)).hits == 1


async def test_expired_entries_are_never_served_and_the_janitor_deletes_them(env: Env) -> None:
    a, b = (await env.teams.create_team("ea")).id, (await env.teams.create_team("eb")).id
    for team in (a, b):
        await env.put(Scope(team, MODEL, "r1"), "old", b"old")
        await env.put(Scope(team, MODEL, "r1"), "new", b"new")
    async with env.pool.connection() as conn:
        await conn.execute(
            "UPDATE response_cache SET expires_at = now() - interval '1 second' WHERE exact_key = 'old'"
        )
    assert await env.exact(Scope(a, MODEL, "r1"), b"old") is None  # expired: never served
    assert await env.store.expire(limit=1) == 1  # a batch at a time
    assert await env.store.expire() == 1
    assert await env.store.expire() == 0
    assert await env.exact(Scope(a, MODEL, "r1"), b"new") == "new"
    async with env.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT k.stored_bytes = (SELECT sum(bytes) FROM response_cache c WHERE c.team_id = k.team_id)"
            " FROM response_cache_keys k WHERE k.team_id IN (%s, %s)",
            (a, b),
        )
        assert [r[0] for r in await cur.fetchall()] == [True, True]  # the totals follow the janitor


async def test_the_size_bound_drops_the_oldest_entries_down_to_nine_tenths(env: Env) -> None:
    team = (await env.teams.create_team("bound")).id
    scope = Scope(team, MODEL, "r1")
    await env.put(scope, "first", b"1")
    async with env.pool.connection() as conn:
        cur = await conn.execute("SELECT bytes FROM response_cache WHERE team_id = %s", (team,))
        row = await cur.fetchone()
    assert row is not None
    size = int(row[0])
    bound = 2 * size + size // 2  # room for two entries and a half
    await env.put(scope, "second", b"2", max_bytes=bound)
    assert (await env.store.stats(team)).entries == 2  # under the bound: nothing evicted
    await env.put(scope, "second again", b"2", max_bytes=bound)  # a replaced entry counts once
    assert (await env.store.stats(team)).entries == 2
    await env.put(scope, "third", b"3", max_bytes=bound)
    assert await env.exact(scope, b"1") is None  # the oldest, beyond the bound
    assert await env.exact(scope, b"2") == "second again"
    assert await env.exact(scope, b"3") == "third"
    async with env.pool.connection() as conn:
        cur = await conn.execute("SELECT stored_bytes FROM response_cache_keys WHERE team_id = %s", (team,))
        stored = await cur.fetchone()
    assert stored is not None
    assert int(stored[0]) == (await env.store.stats(team)).bytes  # counted exactly at the eviction


async def test_a_purge_deletes_the_entries_and_the_teams_key(env: Env) -> None:
    team = (await env.teams.create_team("p")).id
    scope = Scope(team, MODEL, "r1")
    await env.put(scope, "x", b"x")
    before = await env.store.key(team)
    assert await env.store.purge(team) == 1
    after = await env.store.key(team)
    assert after.hmac_key != before.hmac_key  # a new key: a surviving copy of the old rows stays sealed
    assert await env.exact(scope, b"x") is None


async def test_the_stable_revision_follows_the_rollouts(env: Env) -> None:
    assert await env.store.stable_revision(MODEL) == "r1"
    async with env.pool.connection() as conn:
        await conn.execute("INSERT INTO model_rollouts (model, stable_revision) VALUES (%s, 'r9')", (MODEL,))
    assert await env.store.stable_revision(MODEL) == "r9"
    assert await env.store.stable_revision("unknown") is None


async def on_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, LlmfleetError)
    return error_response(exc)


@dataclass
class Api:
    client: httpx.AsyncClient
    issuer: LocalIssuer
    teams: TeamStore
    pool: AsyncConnectionPool

    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.issuer.mint('ops', admin=True)}"}


@pytest.fixture
async def api(vector_db_url: str) -> AsyncIterator[Api]:
    issuer = LocalIssuer.generate()
    jwks_url = issuer.serve()
    try:
        async with AsyncConnectionPool(vector_db_url, min_size=1, max_size=4) as pool:
            spec = load_spec("dev")
            deps = GatewayDeps(
                spec=spec,
                ledger=None,  # not used by the admin routes
                teams=TeamStore(pool),
                keys=FakeKeys(),
                quota=FakeQuota(),
                dispatcher=None,
                nodes=FakeNodeAdmin(),
                health=StaticHealth(),
                resolver=StaticResolver(),
                jwt=JwtVerifier(jwks_url, issuer=issuer.issuer, audience=issuer.audience),
                cache_policies=CachePolicyStore(pool),
                cache_store=CacheStore(pool, SECRET, {n: m.revision for n, m in spec.models.items()}),
            )
            routes = CacheAdminApi(GatewaySettings(secret_key="test-secret"), deps).routes()
            app = Starlette(routes=routes, exception_handlers={LlmfleetError: on_error})
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://gw"
            ) as client:
                yield Api(client, issuer, TeamStore(pool), pool)
    finally:
        issuer.stop()


async def test_an_admin_turns_a_teams_cache_on_and_off(api: Api) -> None:
    team = (await api.teams.create_team("t")).id
    path = f"/admin/teams/{team}/cache"
    r = await api.client.get(path, headers=api.admin())
    assert r.json() == {"team_id": team, "policy": None, "updated_at": None}  # off by default
    r = await api.client.put(
        path, json={"models": {MODEL: {"semantic_threshold": 0.95}}}, headers=api.admin()
    )
    assert r.status_code == 200, r.text
    assert r.json()["policy"]["embedding_model"] == "bge-m3"  # the stack's only embedding model
    assert (await api.client.get(path, headers=api.admin())).json() == r.json()
    stats = (await api.client.get(path + "/stats", headers=api.admin())).json()
    assert stats == {"team_id": team, "entries": 0, "bytes": 0, "hits": 0, "semantic_available": True}
    assert (await api.client.delete(path, headers=api.admin())).json() == {"team_id": team, "deleted": True}
    assert (await api.client.get(path, headers=api.admin())).json()["policy"] is None


async def test_the_admin_routes_refuse_what_they_must(api: Api) -> None:
    team = (await api.teams.create_team("t")).id
    path = f"/admin/teams/{team}/cache"
    user = {"Authorization": f"Bearer {api.issuer.mint('dev', team='t')}"}
    assert (await api.client.get(path, headers=user)).status_code == 403
    assert (await api.client.get(path)).status_code == 401
    for missing in ("/admin/teams/999999/cache", "/admin/teams/x/cache", "/admin/teams/999999/cache/entries"):
        method = "DELETE" if missing.endswith("entries") else "GET"
        r = await api.client.request(method, missing, headers=api.admin())
        assert (r.status_code, r.json()["error"]["code"]) == (404, "team_not_found")
    r = await api.client.put(path, json={"models": {"bge-m3": {}}}, headers=api.admin())
    assert (r.status_code, r.json()["error"]["param"]) == (400, "models.bge-m3")
    r = await api.client.put(path, content=b"[", headers=api.admin())
    assert r.status_code == 400
    assert (await api.client.get(path, headers=api.admin())).json()["policy"] is None  # nothing written


async def test_a_semantic_threshold_without_pgvector_is_a_409(api: Api) -> None:
    team = (await api.teams.create_team("t")).id
    async with api.pool.connection() as conn:  # a database migrated where the server had no pgvector
        await conn.execute("ALTER TABLE response_cache DROP COLUMN embedding")
    path = f"/admin/teams/{team}/cache"
    r = await api.client.put(path, json={"models": {MODEL: {"semantic_threshold": 0.9}}}, headers=api.admin())
    assert (r.status_code, r.json()["error"]["code"]) == (409, "semantic_cache_unavailable")
    r = await api.client.put(path, json={"models": {MODEL: {}}}, headers=api.admin())
    assert r.status_code == 200  # exact matches need no pgvector
