"""The admin API of team guardrail policies (docs/guardrails.md), admin JWT only like every admin route:

    GET    /admin/teams/{team_id}/guardrails   -> {"team_id", "policy" (null: none), "updated_at"}
    PUT    /admin/teams/{team_id}/guardrails   the policy document -> the same, saved
    DELETE /admin/teams/{team_id}/guardrails   -> {"team_id", "deleted": true|false}

An id that names no team is a 404 `team_not_found`; a bad policy a 400 whose `param` names the field
(`apps.core.guardrails.policy.parse_policy`), checked before anything is written.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from apps.core.errors import InvalidRequest, Unavailable
from apps.core.guardrails.api import GuardrailPolicies
from apps.core.guardrails.policy import parse_policy
from apps.gateway.auth import admin_team_path
from apps.gateway.deps import GatewayDeps
from apps.gateway.settings import GatewaySettings
from apps.gateway.validate import parse_json_object

PATH = "/admin/teams/{team_id}/guardrails"


class GuardrailAdminApi:
    """The guardrail routes of one gateway: each a method, `routes()` their table. `policies` None:
    they answer 503 (not configured)."""

    def __init__(
        self, settings: GatewaySettings, deps: GatewayDeps, policies: GuardrailPolicies | None
    ) -> None:
        self.settings = settings
        self.deps = deps
        self.policies = policies

    def routes(self) -> list[Route]:
        return [
            Route(PATH, self.get_policy, methods=["GET"]),
            Route(PATH, self.put_policy, methods=["PUT"]),
            Route(PATH, self.delete_policy, methods=["DELETE"]),
        ]

    async def _team(self, request: Request) -> tuple[int, GuardrailPolicies]:
        """After the admin check: the team id of the path and the store."""
        team_id = await admin_team_path(request, self.deps, self.settings)
        if self.policies is None:
            raise Unavailable("Guardrail policies are not configured.", code="guardrails_not_configured")
        return team_id, self.policies

    async def get_policy(self, request: Request) -> JSONResponse:
        team_id, policies = await self._team(request)
        stored = await policies.get(team_id)
        if stored is None:
            return JSONResponse({"team_id": team_id, "policy": None, "updated_at": None})
        return JSONResponse(stored.as_json())

    async def put_policy(self, request: Request) -> JSONResponse:
        team_id, policies = await self._team(request)
        chat_models = [name for name, m in self.deps.spec.models.items() if m.serving.task == "generate"]
        policy = parse_policy(parse_json_object(await request.body()), chat_models=chat_models)
        if policy.guard_model is not None and policy.guard_model.output:
            # A streamed answer has reached its client before a verdict on all of it could exist.
            raise InvalidRequest(
                "guard_model.output: the guard model checks requests only (set output: false); answers "
                "are screened by the output detectors as they stream.",
                param="guard_model.output",
            )
        stored = await policies.put(team_id, policy)
        return JSONResponse(stored.as_json())

    async def delete_policy(self, request: Request) -> JSONResponse:
        team_id, policies = await self._team(request)
        return JSONResponse({"team_id": team_id, "deleted": await policies.delete(team_id)})
