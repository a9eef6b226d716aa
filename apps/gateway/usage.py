"""`GET /v1/usage?from=&to=[&group_by=day]`: the caller's team only (from the verified identity)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from apps.core.errors import InvalidRequest
from apps.gateway.auth import authenticate, require_team
from apps.gateway.deps import GatewayDeps
from apps.gateway.settings import GatewaySettings

MAX_RANGE = timedelta(days=366)


def parse_time(value: Any, param: str) -> datetime:
    """ISO-8601 (naive = UTC) or Unix seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(float(value), UTC)
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"'{param}' must be ISO-8601 or Unix seconds.", param=param)
    try:
        return datetime.fromtimestamp(float(value), UTC)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidRequest(f"'{param}' must be ISO-8601 or Unix seconds.", param=param) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def usage_route(settings: GatewaySettings, deps: GatewayDeps) -> Any:
    async def usage(request: Request) -> JSONResponse:
        principal = await authenticate(request, deps, settings)
        team_id = require_team(principal)
        q = request.query_params
        end = parse_time(q["to"], "to") if q.get("to") else deps.clock()
        start = parse_time(q["from"], "from") if q.get("from") else end - timedelta(days=30)
        if start >= end or end - start > MAX_RANGE:
            raise InvalidRequest("'from' must be before 'to', at most 366 days apart.", param="from")
        group = q.get("group_by")
        if group not in (None, "", "model", "day"):
            raise InvalidRequest("'group_by' must be 'model' or 'day'.", param="group_by")
        rows = await deps.teams.usage(team_id, start, end, by_day=group == "day")
        total = {
            k: sum(r[k] for r in rows)
            for k in ("requests", "prompt_tokens", "completion_tokens", "total_tokens", "cost_microcredits")
        }
        return JSONResponse(
            {
                "object": "usage",
                "team": principal.team_name,
                "from": start.isoformat(),
                "to": end.isoformat(),
                "group_by": group or "model",
                "data": rows,
                "total": total,
            }
        )

    return usage
