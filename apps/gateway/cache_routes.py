"""The admin API of the response cache (docs/response-cache.md), admin JWT only like every admin route:

    GET    /admin/teams/{team_id}/cache           -> {"team_id", "policy" (null: off), "updated_at"}
    PUT    /admin/teams/{team_id}/cache           the policy document -> the same, saved (the cache is on)
    DELETE /admin/teams/{team_id}/cache           -> {"team_id", "deleted"}: the cache off (entries unused)
    GET    /admin/teams/{team_id}/cache/stats     -> {"team_id", "entries", "bytes", "hits", "semantic_available"}
    DELETE /admin/teams/{team_id}/cache/entries   -> {"team_id", "deleted": n}: every entry and the team's key

An id that names no team is a 404 `team_not_found`; a bad policy a 400 whose `param` names the field; a
semantic threshold on a database without pgvector a 409 `semantic_cache_unavailable`. Nothing is written
before the document validated.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from apps.core.errors import ForwardedError, Unavailable
from apps.core.respcache.policies import CachePolicyStore
from apps.core.respcache.policy import parse_cache_policy
from apps.core.respcache.store import CacheStore
from apps.gateway.auth import admin_team_path
from apps.gateway.deps import GatewayDeps
from apps.gateway.settings import GatewaySettings
from apps.gateway.validate import parse_json_object

PATH = "/admin/teams/{team_id}/cache"


class CacheAdminApi:
    def __init__(self, settings: GatewaySettings, deps: GatewayDeps) -> None:
        self.settings = settings
        self.deps = deps

    def routes(self) -> list[Route]:
        return [
            Route(PATH, self.get_policy, methods=["GET"]),
            Route(PATH, self.put_policy, methods=["PUT"]),
            Route(PATH, self.delete_policy, methods=["DELETE"]),
            Route(PATH + "/stats", self.stats, methods=["GET"]),
            Route(PATH + "/entries", self.purge, methods=["DELETE"]),
        ]

    async def _team(self, request: Request) -> tuple[int, CachePolicyStore, CacheStore]:
        team_id = await admin_team_path(request, self.deps, self.settings)
        if self.deps.cache_policies is None or self.deps.cache_store is None:
            raise Unavailable("The response cache is not configured.", code="cache_not_configured")
        return team_id, self.deps.cache_policies, self.deps.cache_store

    async def get_policy(self, request: Request) -> JSONResponse:
        team_id, policies, _ = await self._team(request)
        stored = await policies.get(team_id)
        if stored is None:
            return JSONResponse({"team_id": team_id, "policy": None, "updated_at": None})
        return JSONResponse(stored.as_json())

    async def put_policy(self, request: Request) -> JSONResponse:
        team_id, policies, store = await self._team(request)
        models = self.deps.spec.models
        policy = parse_cache_policy(
            parse_json_object(await request.body()),
            chat_models=[n for n, m in models.items() if m.serving.task == "generate"],
            embed_models=[n for n, m in models.items() if m.serving.task == "embed"],
        )
        if policy.semantic and not await store.semantic_available():
            raise ForwardedError(
                "Semantic matches need the pgvector extension, which this database does not have; "
                "leave semantic_threshold out (exact matches only) or install pgvector and migrate again.",
                status=409,
                error_type="invalid_request_error",
                param="models",
                code="semantic_cache_unavailable",
            )
        return JSONResponse((await policies.put(team_id, policy)).as_json())

    async def delete_policy(self, request: Request) -> JSONResponse:
        team_id, policies, _ = await self._team(request)
        return JSONResponse({"team_id": team_id, "deleted": await policies.delete(team_id)})

    async def stats(self, request: Request) -> JSONResponse:
        team_id, policies, store = await self._team(request)
        await policies.get(team_id)  # a 404 for a team that does not exist
        stats = await store.stats(team_id)
        return JSONResponse(
            {
                "team_id": team_id,
                "entries": stats.entries,
                "bytes": stats.bytes,
                "hits": stats.hits,
                "semantic_available": await store.semantic_available(),
            }
        )

    async def purge(self, request: Request) -> JSONResponse:
        team_id, policies, store = await self._team(request)
        await policies.get(team_id)
        return JSONResponse({"team_id": team_id, "deleted": await store.purge(team_id)})
