"""The admin view: teams and balances (add credits), every key (revoke), nodes (drain), capacity vs
plan, SLO status from Prometheus (`apps/gateway/slo.py`).

Every action calls the store the admin API calls (`TeamStore.add_credits`,
`KeyStore.revoke`, `NodeAdmin.request_drain`); the credit amount is parsed by the admin
API's own `amount_microcredits`, and the console accepts only positive amounts (a credit).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from apps.core.envnames import env_name
from apps.core.errors import LlmfleetError
from apps.core.sizing.plan import plan_fleet
from apps.gateway.admin_routes import amount_microcredits, valid_node_id
from apps.gateway.console.cache import CacheReport
from apps.gateway.console.forms import Problem, clean_text, first
from apps.gateway.console.guardrails import GuardrailReport
from apps.gateway.console.session import Session
from apps.gateway.console.views import Console, csv_response, to_signin
from apps.gateway.inputs import parse_id
from apps.gateway.settings import GatewaySettings
from apps.gateway.slo import SloStatus

NOT_CONFIGURED = SloStatus(
    error=f"Prometheus is not configured (set {env_name(GatewaySettings, 'prometheus_url')})."
)
CAPACITY_HEADER = (
    "model",
    "ready_nodes",
    "streams_available",
    "in_flight",
    "planned_replicas",
    "planned_peak_streams",
)


def capacity(plan: dict[str, tuple[int, int, int]], nodes: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Per model: ready nodes x the plan's streams per replica, in flight, vs the plan's replicas and peak."""
    ready: dict[str, int] = defaultdict(int)
    in_flight: dict[str, int] = defaultdict(int)
    for node in nodes:
        for model in node.get("models") or []:
            in_flight[model] += int(node.get("in_flight") or 0)
            if node.get("state") == "ready":
                ready[model] += 1
    return [
        (name, ready[name], ready[name] * seqs, in_flight[name], replicas, peak)
        for name, (seqs, replicas, peak) in sorted(plan.items())
    ]


class AdminView:
    """The console's admin view's routes: each a method, `routes()` their table."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.deps = console.deps
        self.cache = CacheReport(console.deps, lambda: console.usage)
        self.guardrails = GuardrailReport(console.deps)
        # model -> (max_num_seqs, replicas, peak streams), from the planner
        self.plan = {
            n: (m.max_num_seqs, m.replicas, m.peak_streams)
            for n, m in plan_fleet(self.deps.spec).models.items()
        }

    def routes(self) -> list[Route]:
        return [
            Route("/admin", self.admin_view, methods=["GET"]),
            Route("/admin/capacity.csv", self.capacity_csv, methods=["GET"]),
            Route("/admin/credits", self.add_credits, methods=["POST"]),
            Route("/admin/keys/{key_id}/revoke", self.revoke_key, methods=["POST"]),
            Route("/admin/nodes/{node_id}/drain", self.drain, methods=["POST"]),
        ]

    async def admin_session(self, request: Request) -> Session | None:
        session = await self.console.session(request)
        return session if session is not None and session.is_admin else None

    async def page(
        self, request: Request, session: Session, extra: dict[str, Any], status: int = 200
    ) -> Response:
        nodes = await self.deps.nodes.list_nodes()
        slo = await self.deps.slo.status() if self.deps.slo is not None else NOT_CONFIGURED
        teams = await self.deps.teams.list_teams()
        ctx = {
            "slo": slo,
            "teams": teams,
            # Metrics label teams by id (issue 27); the admin reads names.
            "team_names": {str(t.id): t.name for t in teams},
            "keys": await self.deps.keys.list_keys(None),
            "last_used": await self.console.usage.key_last_used(None),
            "nodes": nodes,
            "capacity": capacity(self.plan, nodes),
            "cache": await self.cache.teams({t.id: t.name for t in teams}),
            "guardrails": await self.guardrails.teams({t.id: t.name for t in teams}),
            **extra,
        }
        return self.console.render(request, "admin.html", ctx, status, session)

    async def admin_view(self, request: Request) -> Response:
        session = await self.admin_session(request)
        if session is None:
            return to_signin()
        return await self.page(request, session, {})

    async def capacity_csv(self, request: Request) -> Response:
        if await self.admin_session(request) is None:
            return to_signin()
        return csv_response(
            "capacity.csv", CAPACITY_HEADER, capacity(self.plan, await self.deps.nodes.list_nodes())
        )

    async def add_credits(self, request: Request) -> Response:
        session = await self.admin_session(request)
        if session is None:
            return to_signin()
        try:
            form = await self.console.checked_form(request, session)
            team = parse_id(first(form, "team"))  # ASCII digits only (apps.gateway.inputs)
            if team is None:
                raise Problem("Pick a team.")
            try:
                micro = amount_microcredits({"amount": first(form, "amount")})
            except LlmfleetError as exc:
                raise Problem(exc.message) from None
            if micro <= 0:
                raise Problem("The amount must be a positive number of credits.")
            entry = await self.deps.teams.add_credits(team, micro, clean_text(form, "reason") or "console")
        except Problem as problem:
            return await self.page(request, session, {"error": problem.message}, problem.status)
        except LlmfleetError as exc:
            return await self.page(request, session, {"error": exc.message}, exc.status)
        return await self.page(
            request, session, {"notice": f"Added {first(form, 'amount')} credits to {entry['team']}."}
        )

    async def revoke_key(self, request: Request) -> Response:
        session = await self.admin_session(request)
        if session is None:
            return to_signin()
        try:
            await self.console.checked_form(request, session)
            raw = str(request.path_params["key_id"])
            key_id = parse_id(raw)  # ASCII digits only
            if key_id is None:
                raise Problem(f"No key {raw[:20]!r}.", 404)
            await self.deps.keys.revoke(key_id)
        except Problem as problem:
            return await self.page(request, session, {"error": problem.message}, problem.status)
        except LlmfleetError as exc:
            return await self.page(request, session, {"error": exc.message}, exc.status)
        return await self.page(request, session, {"notice": f"Key {raw} revoked."})

    async def drain(self, request: Request) -> Response:
        session = await self.admin_session(request)
        if session is None:
            return to_signin()
        node_id = str(request.path_params["node_id"])
        try:
            await self.console.checked_form(request, session)
            if not valid_node_id(node_id):
                raise Problem(f"No node {node_id[:40]!r}.", 404)
            if not await self.deps.nodes.request_drain(node_id):
                raise Problem(
                    f"Node {node_id[:128]} is not connected to any orchestrator; nothing to drain.", 409
                )
        except Problem as problem:
            return await self.page(request, session, {"error": problem.message}, problem.status)
        return await self.page(request, session, {"notice": f"Drain requested for {node_id}."})
