"""The console: server-rendered pages for teams and admins under `/console` (one mount)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from apps.gateway.console.admin import AdminView
from apps.gateway.console.signin import signin_routes
from apps.gateway.console.team import TeamView
from apps.gateway.console.views import HERE, Console
from apps.gateway.deps import GatewayDeps
from apps.gateway.settings import GatewaySettings


def console_mount(settings: GatewaySettings, deps: GatewayDeps) -> Mount:
    console = Console.build(settings, deps)

    async def home(request: Request) -> Response:
        session = await console.session(request)
        target = (
            "/console/signin"
            if session is None
            else "/console/admin"
            if session.is_admin
            else "/console/team"
        )
        return RedirectResponse(target, status_code=303)

    routes = [
        Route("/", home, methods=["GET"]),
        *signin_routes(console),
        *TeamView(console).routes(),
        *AdminView(console).routes(),
        Mount("/static", app=StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    return Mount("/console", routes=routes)
