"""Bearer authentication: an API key (`sk-lf-...`) or a JWT verified via JWKS."""

from __future__ import annotations

from datetime import UTC, datetime

from starlette.requests import Request

from apps.core.errors import AuthenticationFailed, NotFound, PermissionDenied
from apps.core.identity.jwt_verify import looks_like_jwt
from apps.core.identity.principal import Principal
from apps.core.quota.admission import Limits, TeamLimits
from apps.core.sharing import DEFAULT_WEIGHT
from apps.gateway.deps import GatewayDeps
from apps.gateway.inputs import only_params, parse_id, shown
from apps.gateway.settings import GatewaySettings


def bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthenticationFailed("You didn't provide an API key (Authorization: Bearer <key>).")
    return token.strip()


async def authenticate(request: Request, deps: GatewayDeps, settings: GatewaySettings) -> Principal:
    return await authenticate_token(bearer(request), deps, settings)


async def authenticate_token(token: str, deps: GatewayDeps, settings: GatewaySettings) -> Principal:
    """An API key's or a JWT's principal (the console signs in with the same check as the API)."""
    if not looks_like_jwt(token):
        return await deps.keys.authenticate(token)
    if deps.jwt is None:
        raise AuthenticationFailed("JWT authentication is not configured.", code="invalid_jwt")
    identity = await deps.jwt.verify(token)
    team_id: int | None = None
    team_name: str | None = None
    weight = DEFAULT_WEIGHT
    team_limits: TeamLimits | None = None
    ref = identity.team_id if identity.team_id is not None else identity.team
    if ref is not None:  # an int is an id, a str a name: the claim said which
        try:
            team = await deps.teams.get_team(ref)
        except NotFound:
            raise AuthenticationFailed(f"team {ref!r} of the token does not exist.") from None
        team_id, team_name, weight, team_limits = team.id, team.name, team.weight, team.limits()
    return Principal(
        kind="jwt",
        subject=f"jwt-{identity.subject}",
        team_id=team_id,
        team_name=team_name,
        key_id=None,
        model_allowlist=identity.models or (),
        models_restricted=identity.models is not None,
        limits=Limits(
            settings.jwt_max_streams or None,
            settings.jwt_rpm or None,
            settings.jwt_tokens_per_day or None,
            team_limits,
        ),
        is_admin=identity.is_admin,
        expires_at=_exp(identity.claims.get("exp")),
        team_weight=weight,
        priority_class=identity.priority_class,
    )


def _exp(value: object) -> datetime | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(float(value), UTC)
    return None


async def require_admin(request: Request, deps: GatewayDeps, settings: GatewaySettings) -> Principal:
    token = bearer(request)
    if not looks_like_jwt(token):
        raise PermissionDenied("The admin API needs a JWT with the admin role.", code="admin_required")
    principal = await authenticate(request, deps, settings)
    if not principal.is_admin:
        raise PermissionDenied("The admin API needs a JWT with the admin role.", code="admin_required")
    return principal


async def admin_team_path(request: Request, deps: GatewayDeps, settings: GatewaySettings) -> int:
    """An admin route on `/admin/teams/{team_id}/...` without query parameters: after the admin check,
    the path's team id (404 `team_not_found` for one that cannot name a team)."""
    await require_admin(request, deps, settings)
    only_params(request.query_params, ())
    raw = str(request.path_params["team_id"])
    team_id = parse_id(raw)
    if team_id is None:
        raise NotFound(f"team {shown(raw, 20)} does not exist", param="team_id", code="team_not_found")
    return team_id


def require_team(principal: Principal) -> int:
    if principal.team_id is None:
        raise PermissionDenied("This identity belongs to no team.", code="no_team")
    return principal.team_id
