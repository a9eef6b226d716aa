"""`GET /v1/usage?from=&to=[&group_by=day]`: the caller's team only (from the verified identity)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from apps.core.errors import InvalidRequest
from apps.gateway.auth import authenticate, require_team
from apps.gateway.deps import GatewayDeps
from apps.gateway.settings import GatewaySettings

MAX_RANGE = timedelta(days=366)
MIN_TIME = datetime(1970, 1, 1, tzinfo=UTC)
MAX_TIME = datetime(9998, 12, 31, tzinfo=UTC)


# Unix seconds accepted: years 1970-9998 (so every result, plus a day of margin, is a datetime).
MAX_UNIX_S = 253_370_764_800.0


def _from_unix(seconds: float, param: str) -> datetime:
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_UNIX_S:
        raise InvalidRequest(f"'{param}' is out of range (Unix seconds 0 to {MAX_UNIX_S:.0f}).", param=param)
    return datetime.fromtimestamp(seconds, UTC)


def parse_time(value: Any, param: str) -> datetime:
    """ISO-8601 (naive = UTC) or Unix seconds; anything else, or out of range, is a 400."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return _from_unix(float(value), param)
    if not isinstance(value, str) or not value or len(value) > 64:
        raise InvalidRequest(f"'{param}' must be ISO-8601 or Unix seconds.", param=param)
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return _from_unix(seconds, param)
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        parsed = parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
        parsed.astimezone(UTC)  # an offset that moves it past year 9999 fails here, not later
        if not MIN_TIME <= parsed <= MAX_TIME:
            raise ValueError
    except (ValueError, OverflowError):
        raise InvalidRequest(f"'{param}' must be ISO-8601 or Unix seconds.", param=param) from None
    return parsed


def usage_route(settings: GatewaySettings, deps: GatewayDeps) -> Any:
    async def usage(request: Request) -> JSONResponse:
        principal = await authenticate(request, deps, settings)
        team_id = require_team(principal)
        q = request.query_params
        end = parse_time(q["to"], "to") if q.get("to") else deps.clock()
        start = parse_time(q["from"], "from") if q.get("from") else max(end - timedelta(days=30), MIN_TIME)
        if start >= end or end - start > MAX_RANGE:
            raise InvalidRequest("'from' must be before 'to', at most 366 days apart.", param="from")
        group = q.get("group_by")
        if group not in (None, "", "model", "day"):
            raise InvalidRequest("'group_by' must be 'model' or 'day'.", param="group_by")
        rows = await deps.teams.usage(team_id, start, end, by_day=group == "day")
        total = {
            k: sum(r[k] for r in rows)
            for k in (
                "requests",
                "prompt_tokens",
                "cached_prompt_tokens",
                "completion_tokens",
                "total_tokens",
                "cost_microcredits",
            )
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
