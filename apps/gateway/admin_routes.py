"""The admin API (JWT with the admin role): teams (and their fair-queue weight), keys, credits,
nodes, the fair queues."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal, DecimalException
from typing import Any, TypeGuard

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from apps.core.errors import InvalidRequest, NotFound, Unavailable
from apps.core.sharing import ALL_CLASSES, priority_class, priority_classes, team_weight
from apps.gateway.auth import require_admin
from apps.gateway.deps import GatewayDeps
from apps.gateway.inputs import checked_text, only_params, parse_id, shown
from apps.gateway.settings import GatewaySettings
from apps.gateway.usage import parse_time
from apps.gateway.validate import parse_json_object

NODE_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def valid_node_id(node_id: object) -> TypeGuard[str]:
    """1-128 of [A-Za-z0-9._-]: what `POST /admin/nodes` issues tokens for (anything else, a NUL
    included, names no node and never reaches the store)."""
    return isinstance(node_id, str) and 0 < len(node_id) <= 128 and set(node_id) <= NODE_ID_CHARS


def _key_id(request: Request) -> int:
    """The key id in the path: ASCII digits (`apps.gateway.inputs.parse_id`), else a 404 like any id
    that names no key."""
    raw = str(request.path_params["key_id"])
    key_id = parse_id(raw)
    if key_id is None:
        raise NotFound(f"key {shown(raw, 20)} does not exist", param="id", code="key_not_found")
    return key_id


async def _json(request: Request, fields: frozenset[str]) -> dict[str, Any]:
    """The body, a JSON object of the route's `fields` only: a field it does not know (a typo such
    as `max_stream`) is a 400 naming it, never silently dropped (a key created without its limit)."""
    body = parse_json_object(await request.body() or b"{}")
    unknown = sorted(set(body) - fields)
    if unknown:
        raise InvalidRequest(
            f"Unknown field '{unknown[0]}'; expected one of: {', '.join(sorted(fields))}.", param=unknown[0]
        )
    return body


# The columns' ranges (INTEGER, BIGINT): a larger value is a 400, not a database error.
INT_LIMITS = {
    "rpm": 2**31 - 1,
    "max_streams": 2**31 - 1,
    "tokens_per_day": 2**63 - 1,
    "max_tokens": 2**31 - 1,
    "max_context": 2**31 - 1,
    "tokens_per_minute": 2**63 - 1,
}
KEY_LIMITS = frozenset(INT_LIMITS) - {"tokens_per_minute"}  # a team's budget, not a key's
TEAM_FIELDS = frozenset({"name", "credits", "weight", "priority_classes"})
KEY_FIELDS = frozenset(
    {"team", "team_id", "model_allowlist", "expires_at", "name", "priority_class", *KEY_LIMITS}
)
KEY_PATCH_FIELDS = KEY_LIMITS
SHARING_FIELDS = frozenset(
    {"team", "team_id", "weight", "max_streams", "tokens_per_minute", "priority_classes"}
)
CREDIT_FIELDS = frozenset({"team", "team_id", "amount", "amount_microcredits", "reason"})
NODE_FIELDS = frozenset({"node_id", "location", "pool", "models"})
MAX_AMOUNT_MICROCREDITS = 10**18


def _opt_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not 0 < value <= INT_LIMITS.get(name, 2**31 - 1)
    ):
        raise InvalidRequest(
            f"'{name}' must be a positive integer (at most {INT_LIMITS.get(name, 2**31 - 1)}) or null.",
            param=name,
        )
    return value


def team_ref(values: Mapping[str, Any], *, query: bool = False) -> int | str | None:
    """The team a call names: `team_id` (an integer id) or `team` (a name), never both. A name is
    never read as an id, whatever its characters (a team may be called "2"). None: neither given."""
    team_id, name = values.get("team_id"), values.get("team")
    if team_id is not None and name is not None:
        raise InvalidRequest("Give either 'team_id' (id) or 'team' (name), not both.", param="team_id")
    if team_id is not None:
        if query and isinstance(team_id, str):
            team_id = parse_id(team_id) or 0  # ASCII digits only (apps.gateway.inputs)
        if isinstance(team_id, bool) or not isinstance(team_id, int) or not 0 < team_id < 2**63:
            raise InvalidRequest("'team_id' must be a positive integer (a team's id).", param="team_id")
        return team_id
    if name is not None:
        if not isinstance(name, str) or not name:
            raise InvalidRequest(
                "'team' must be a team's name (a string); use 'team_id' for its id.", param="team"
            )
        return checked_text(name, "team")
    return None


def _required_team(body: Mapping[str, Any]) -> int | str:
    ref = team_ref(body)
    if ref is None:
        raise InvalidRequest("'team_id' (id) or 'team' (name) is required.", param="team")
    return ref


def amount_microcredits(body: dict[str, Any]) -> int:
    """`amount` in credits (decimal allowed) or `amount_microcredits` as an integer."""
    if body.get("amount_microcredits") is not None:
        value = body["amount_microcredits"]
        if isinstance(value, bool) or not isinstance(value, int) or abs(value) > MAX_AMOUNT_MICROCREDITS:
            raise InvalidRequest(
                "'amount_microcredits' must be an integer (at most 10^18).", param="amount_microcredits"
            )
        return value
    raw = body.get("amount")
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise InvalidRequest("'amount' (credits) is required.", param="amount")
    try:
        micro = Decimal(str(raw).strip()) * 1_000_000
    except DecimalException:
        raise InvalidRequest("'amount' must be a number of credits.", param="amount") from None
    if not micro.is_finite() or abs(micro) > MAX_AMOUNT_MICROCREDITS:
        raise InvalidRequest("'amount' must be a finite number of credits (at most 10^12).", param="amount")
    if micro != micro.to_integral_value():
        raise InvalidRequest("'amount' has more than 6 decimals.", param="amount")
    return int(micro)


class AdminApi:
    """The admin routes of one gateway: each a method, `routes()` their table."""

    def __init__(self, settings: GatewaySettings, deps: GatewayDeps) -> None:
        self.settings = settings
        self.deps = deps

    def routes(self) -> list[Route]:
        return [
            Route("/admin/teams", self.create_team, methods=["POST"]),
            Route("/admin/teams", self.list_teams, methods=["GET"]),
            Route("/admin/teams/sharing", self.set_sharing, methods=["POST"]),
            Route("/admin/queues", self.queues, methods=["GET"]),
            Route("/admin/keys", self.create_key, methods=["POST"]),
            Route("/admin/keys", self.list_keys, methods=["GET"]),
            Route("/admin/keys/{key_id}", self.revoke_key, methods=["DELETE"]),
            Route("/admin/keys/{key_id}", self.update_key, methods=["PATCH"]),
            Route("/admin/credits", self.add_credits, methods=["POST"]),
            Route("/admin/nodes", self.list_nodes, methods=["GET"]),
            Route("/admin/nodes", self.create_node, methods=["POST"]),
            Route("/admin/nodes/{node_id}", self.revoke_node, methods=["DELETE"]),
        ]

    async def create_team(self, request: Request) -> JSONResponse:
        await require_admin(request, self.deps, self.settings)
        body = await _json(request, TEAM_FIELDS)
        name = body.get("name")
        if not isinstance(name, str):
            raise InvalidRequest("'name' is required.", param="name")
        weight = (
            team_weight(body["weight"])
            if body.get("weight") is not None
            else self.deps.spec.sharing.default_weight
        )
        classes = (
            priority_classes(body["priority_classes"])
            if body.get("priority_classes") is not None
            else ALL_CLASSES
        )
        credits = 0
        if body.get("credits") is not None:  # parsed before anything is written
            try:
                credits = amount_microcredits({"amount": body["credits"]})
            except InvalidRequest as exc:
                raise InvalidRequest(exc.message.replace("'amount'", "'credits'"), param="credits") from None
            if credits < 0:
                raise InvalidRequest("'credits' must not be negative.", param="credits")
        # The team and its initial credits in one transaction: a refusal leaves no team behind.
        team = await self.deps.teams.create_team(name, weight, credits, classes)
        return JSONResponse(team.as_json(), status_code=201)

    async def list_teams(self, request: Request) -> JSONResponse:
        await require_admin(request, self.deps, self.settings)
        return JSONResponse(
            {"object": "list", "data": [t.as_json() for t in await self.deps.teams.list_teams()]}
        )

    async def create_key(self, request: Request) -> JSONResponse:
        await require_admin(request, self.deps, self.settings)
        body = await _json(request, KEY_FIELDS)
        team = _required_team(body)
        allow = body.get("model_allowlist") or []
        if not isinstance(allow, list) or not all(isinstance(m, str) for m in allow):
            raise InvalidRequest("'model_allowlist' must be a list of model names.", param="model_allowlist")
        unknown = [m for m in allow if m not in self.deps.spec.models]
        if unknown:
            raise NotFound(f"unknown models in allowlist: {', '.join(unknown)}", param="model_allowlist")
        expires: datetime | None = None
        if body.get("expires_at") is not None:
            expires = parse_time(body["expires_at"], "expires_at")
        name = body.get("name")
        if name is not None and not isinstance(name, str):
            raise InvalidRequest("'name' must be a string.", param="name")
        name = checked_text(name, "name") if name is not None else None
        secret, record = await self.deps.keys.create(
            team=team,
            model_allowlist=allow,
            rpm=_opt_int(body, "rpm"),
            tokens_per_day=_opt_int(body, "tokens_per_day"),
            max_streams=_opt_int(body, "max_streams"),
            expires_at=expires,
            name=name if isinstance(name, str) else None,
            max_tokens=_opt_int(body, "max_tokens"),
            max_context=_opt_int(body, "max_context"),
            priority_class=priority_class(body.get("priority_class")),
        )
        return JSONResponse({**record.as_json(), "key": secret}, status_code=201)

    async def update_key(self, request: Request) -> JSONResponse:
        """Change a key's limits: each field given is set (null clears it), the others stay."""
        await require_admin(request, self.deps, self.settings)
        key_id = _key_id(request)
        body = await _json(request, KEY_PATCH_FIELDS)
        if not body:
            raise InvalidRequest(
                f"Nothing to change; give one of: {', '.join(sorted(KEY_PATCH_FIELDS))}.", param=None
            )
        record = await self.deps.keys.update(key_id, {name: _opt_int(body, name) for name in body})
        return JSONResponse(record.as_json())

    async def set_sharing(self, request: Request) -> JSONResponse:
        await require_admin(request, self.deps, self.settings)
        body = await _json(request, SHARING_FIELDS)
        team = _required_team(body)
        weight = team_weight(body["weight"]) if body.get("weight") is not None else None
        limits: dict[str, int | None] = {}
        for name in ("max_streams", "tokens_per_minute"):
            if name in body:  # null clears the limit
                limits[name] = _opt_int(body, name)
        classes = priority_classes(body["priority_classes"]) if "priority_classes" in body else None
        if weight is None and not limits and classes is None:
            raise InvalidRequest(
                "Give 'weight', 'max_streams', 'tokens_per_minute' or 'priority_classes'.", param="weight"
            )
        team_row = await self.deps.teams.set_sharing(team, weight=weight, priority_classes=classes, **limits)
        return JSONResponse(team_row.as_json())

    async def queues(self, request: Request) -> JSONResponse:
        await require_admin(request, self.deps, self.settings)
        if self.deps.board is None:
            raise Unavailable("The queue board is not configured.", code="no_queue_board")
        return JSONResponse(
            {"object": "list", "data": await self.deps.board.read(sorted(self.deps.spec.models))}
        )

    async def list_keys(self, request: Request) -> JSONResponse:
        await require_admin(request, self.deps, self.settings)
        # A parameter it does not take is a 400: `team[]=2` ignored would list every team's keys.
        only_params(request.query_params, ("team", "team_id"))
        keys = await self.deps.keys.list_keys(team_ref(request.query_params, query=True))
        return JSONResponse({"object": "list", "data": [k.as_json() for k in keys]})

    async def revoke_key(self, request: Request) -> JSONResponse:
        await require_admin(request, self.deps, self.settings)
        key_id = _key_id(request)
        changed = await self.deps.keys.revoke(key_id)
        return JSONResponse({"id": key_id, "revoked": True, "changed": changed})

    async def add_credits(self, request: Request) -> JSONResponse:
        await require_admin(request, self.deps, self.settings)
        body = await _json(request, CREDIT_FIELDS)
        team = _required_team(body)
        reason = body.get("reason") if isinstance(body.get("reason"), str) else "admin"
        entry = await self.deps.teams.add_credits(
            team, amount_microcredits(body), checked_text(str(reason), "reason")
        )
        return JSONResponse(entry, status_code=201)

    async def list_nodes(self, request: Request) -> JSONResponse:
        await require_admin(request, self.deps, self.settings)
        return JSONResponse({"object": "list", "data": await self.deps.nodes.list_nodes()})

    async def create_node(self, request: Request) -> JSONResponse:
        await require_admin(request, self.deps, self.settings)
        body = await _json(request, NODE_FIELDS)
        node_id, location = body.get("node_id"), body.get("location", "onprem")
        if not valid_node_id(node_id):
            raise InvalidRequest("'node_id' must be 1-128 of [A-Za-z0-9._-].", param="node_id")
        if location not in ("onprem", "cloud"):
            raise InvalidRequest("'location' must be onprem or cloud.", param="location")
        pool = body.get("pool", False)
        if not isinstance(pool, bool):
            raise InvalidRequest("'pool' must be a boolean.", param="pool")
        models = body.get("models")
        if not isinstance(models, list) or not models or not all(isinstance(m, str) for m in models):
            raise InvalidRequest("'models' (the model names the node may serve) is required.", param="models")
        unknown = [m for m in models if m not in self.deps.spec.models]
        if unknown:
            raise NotFound(f"unknown models: {', '.join(unknown)}", param="models")
        # A pool token admits every node id `<pool>/<instance>` (EKS pods, named at run time).
        token = await self.deps.nodes.issue_token(node_id, location, pool=pool, models=models)
        return JSONResponse(
            {
                "node_id": node_id,
                "location": location,
                "kind": "pool" if pool else "node",
                "models": models,
                "token": token,
            },
            status_code=201,
        )

    async def revoke_node(self, request: Request) -> JSONResponse:
        await require_admin(request, self.deps, self.settings)
        node_id = request.path_params["node_id"]
        if not valid_node_id(node_id) or not await self.deps.nodes.revoke(node_id):
            raise NotFound(
                f"node {shown(node_id, 128)} does not exist", param="node_id", code="node_not_found"
            )
        return JSONResponse({"node_id": node_id, "revoked": True})
