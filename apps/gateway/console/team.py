"""The team view: balance, burn and forecast, usage charts with tables and CSV, keys, recent requests.

Every query is scoped by the session's team id (set at sign-in from the verified
principal); a key-scoped session sees only its own key's usage and cannot change keys.
Keys are created and revoked through the same `KeyStore` calls as the admin API.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from apps.core.errors import LlmfleetError, StoreUnavailable
from apps.core.ledger.rollups import DailyUsage, burn_rate, days_left
from apps.core.quota.refusals import RefusalCount
from apps.core.sharing import PriorityClass
from apps.gateway.console.cache import CacheReport
from apps.gateway.console.forms import (
    Problem,
    UsageQuery,
    clean_text,
    expiry,
    first,
    positive_int,
    usage_query,
)
from apps.gateway.console.guardrails import GuardrailReport
from apps.gateway.console.session import Session
from apps.gateway.console.share import QueueShare, team_shares
from apps.gateway.console.views import Console, csv_response, to_signin
from apps.gateway.inputs import parse_id

USAGE_HEADER = (
    "day_utc",
    "model",
    "requests",
    "prompt_tokens",
    "cached_prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "cost_credits",
)


def chart_data(query: UsageQuery, rows: list[DailyUsage]) -> dict[str, Any]:
    """One series per model over every day of the range (zero-filled), for the three charts."""
    days = query.days()
    index = {d: i for i, d in enumerate(days)}
    models = sorted({r.model for r in rows})
    series: dict[str, dict[str, list[float]]] = {
        m: {k: [0.0] * len(days) for k in ("tokens", "requests", "cost")} for m in models
    }
    for r in rows:
        i = index[r.day]
        series[r.model]["tokens"][i] = r.total_tokens
        series[r.model]["requests"][i] = r.requests
        series[r.model]["cost"][i] = r.cost_microcredits / 1_000_000
    stamps = [int(datetime.combine(d, datetime.min.time(), UTC).timestamp()) for d in days]
    return {"days": stamps, "models": models, "series": series}


def _usage_rows(rows: list[DailyUsage]) -> list[tuple[Any, ...]]:
    return [
        (r.day.isoformat(), r.model, r.requests, r.prompt_tokens, r.cached_prompt_tokens, r.completion_tokens,
         r.total_tokens, f"{r.cost_microcredits / 1_000_000:.6f}")
        for r in rows
    ]  # fmt: skip


class TeamView:
    """The team view's routes: each a method, `routes()` their table."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.deps = console.deps
        self.cache = CacheReport(console.deps, lambda: console.usage)
        self.guardrails = GuardrailReport(console.deps)

    def routes(self) -> list[Route]:
        return [
            Route("/team", self.team_view, methods=["GET"]),
            Route("/team/usage.csv", self.usage_csv, methods=["GET"]),
            Route("/team/keys", self.create_key, methods=["POST"]),
            Route("/team/keys/{key_id}/revoke", self.revoke_key, methods=["POST"]),
        ]

    async def team_session(self, request: Request) -> Session | None:
        session = await self.console.session(request)
        if session is None or session.team_id is None:
            return None
        return session

    async def query_of(self, request: Request) -> UsageQuery:
        return usage_query(dict(request.query_params), self.deps.spec.models, self.deps.clock().date())

    async def context(self, session: Session, query: UsageQuery | None) -> dict[str, Any]:
        assert session.team_id is not None
        team = await self.deps.teams.get_team(session.team_id)
        today = self.deps.clock().date()
        usage = self.console.usage
        week = await usage.daily(
            team.id, today - timedelta(days=6), today + timedelta(days=1), key_id=session.key_id
        )
        burn = burn_rate(week, today)
        rows = (
            await usage.daily(
                team.id, query.start, query.end_exclusive, key_id=session.key_id, model=query.model
            )
            if query
            else []
        )
        keys = await self.deps.keys.list_keys(team.id)
        if session.kind == "key":
            keys = [k for k in keys if k.id == session.key_id]
        return {
            "team": team,
            "burn": burn,
            "days_left": days_left(team.balance_microcredits, burn),
            "query": query,
            "models": sorted(self.deps.spec.models),
            "rows": _usage_rows(rows),
            "chart": chart_data(query, rows) if query else None,
            "cache": await self.cache.team(team.id, query, session.key_id) if query else None,
            "guardrails": await self.guardrails.team(team.id, query) if query else None,
            "keys": keys,
            "last_used": await usage.key_last_used(team.id),
            "recent": await usage.recent(team.id, key_id=session.key_id),
            "counts": await usage.status_counts(
                team.id, self.deps.clock() - timedelta(days=1), key_id=session.key_id
            ),
            "refusals": await self.refusals(team.id, session.key_id),
            "shares": await self.shares(team.id) if session.kind != "key" else None,
        }

    async def shares(self, team_id: int) -> list[QueueShare] | None:
        """The team's queue share per model; None when the board is not wired or Redis fails."""
        if self.deps.board is None:
            return None
        try:
            return team_shares(await self.deps.board.read(sorted(self.deps.spec.models)), team_id)
        except (StoreUnavailable, RedisError, OSError):
            return None

    async def refusals(self, team_id: int, key_id: int | None) -> list[RefusalCount] | None:
        """None when the counter is not wired or Redis does not answer (the page still renders)."""
        if self.deps.refusals is None:
            return None
        try:
            return await self.deps.refusals.recent(team_id, key_id)
        except StoreUnavailable:
            return None

    async def page(
        self, request: Request, session: Session, extra: dict[str, Any], status: int = 200
    ) -> Response:
        query: UsageQuery | None = None
        error = extra.pop("error", None)
        try:
            query = await self.query_of(request)
        except Problem as problem:
            error, status = problem.message, problem.status
        ctx = {**await self.context(session, query), "error": error, **extra}
        return self.console.render(request, "team.html", ctx, status, session)

    async def team_view(self, request: Request) -> Response:
        session = await self.team_session(request)
        if session is None:
            return to_signin()
        return await self.page(request, session, {})

    async def usage_csv(self, request: Request) -> Response:
        session = await self.team_session(request)
        if session is None:
            return to_signin()
        assert session.team_id is not None
        try:
            query = await self.query_of(request)
        except Problem as problem:
            return self.console.problem(request, problem, session)
        rows = await self.console.usage.daily(
            session.team_id, query.start, query.end_exclusive, key_id=session.key_id, model=query.model
        )
        return csv_response(f"usage-{query.start}-{query.end}.csv", USAGE_HEADER, _usage_rows(rows))

    async def create_key(self, request: Request) -> Response:
        session = await self.team_session(request)
        if session is None:
            return to_signin()
        try:
            if not session.manages_keys:
                raise Problem(
                    "A key-scoped session cannot create keys; sign in with your team's identity.", 403
                )
            form = await self.console.checked_form(request, session)
            allow = [m for m in form.get("model", []) if m]
            unknown = [m for m in allow if m not in self.deps.spec.models]
            if unknown:
                raise Problem(f"Unknown model in the allowlist: {', '.join(unknown)[:200]}.")
            name = clean_text(form, "name") or None
            klass = await self.allowed_class(session, first(form, "priority_class"))
            secret, record = await self.deps.keys.create(
                team=session.team_id or 0, model_allowlist=allow, rpm=positive_int(form, "rpm"),
                tokens_per_day=positive_int(form, "tokens_per_day"), max_streams=positive_int(form, "max_streams"),
                max_tokens=positive_int(form, "max_tokens"), max_context=positive_int(form, "max_context"),
                expires_at=expiry(form, self.deps.clock()), name=name, priority_class=klass,
            )  # fmt: skip
        except Problem as problem:
            return await self.page(request, session, {"error": problem.message}, problem.status)
        except LlmfleetError as exc:
            return await self.page(request, session, {"error": exc.message}, exc.status)
        return await self.page(request, session, {"created": {"secret": secret, "record": record}}, 201)

    async def allowed_class(self, session: Session, raw: str) -> PriorityClass:
        """The form's class if the admin lets the team use it (empty: the first allowed), else 403."""
        team = await self.deps.teams.get_team(session.team_id or 0)
        allowed = team.priority_classes
        if not raw:
            return allowed[0]
        if raw not in {c.value for c in allowed}:
            raise Problem(
                f"Your team may not create {raw[:40]!r} keys; the admin allows: "
                f"{', '.join(c.value for c in allowed)}.",
                403,
            )
        return PriorityClass(raw)

    async def revoke_key(self, request: Request) -> Response:
        session = await self.team_session(request)
        if session is None:
            return to_signin()
        try:
            if not session.manages_keys:
                raise Problem("A key-scoped session cannot revoke keys.", 403)
            await self.console.checked_form(request, session)
            raw = str(request.path_params["key_id"])
            key_id = parse_id(raw)  # ASCII digits only
            mine = {k.id for k in await self.deps.keys.list_keys(session.team_id or 0)}
            if key_id is None or key_id not in mine:
                raise Problem(f"Your team has no key {raw[:20]!r}.", 404)
            await self.deps.keys.revoke(key_id)
        except Problem as problem:
            return await self.page(request, session, {"error": problem.message}, problem.status)
        return await self.page(request, session, {"notice": f"Key {raw} revoked."})
