"""What every console page shares: templates, security headers, the session check, CSV."""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.templating import Jinja2Templates

from apps.core.identity.console_sessions import ConsoleSessions
from apps.core.ledger.rollups import UsageRollups
from apps.gateway.console.cache import gpu_time
from apps.gateway.console.forms import Problem, first, read_form
from apps.gateway.console.session import COOKIE, Session, SessionCodec
from apps.gateway.deps import GatewayDeps
from apps.gateway.settings import GatewaySettings

HERE = Path(__file__).resolve().parent
# No inline script or style anywhere: data reaches the charts as JSON in a non-executed
# `<script type="application/json">` block read by the vendored, same-origin script.
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


def credits(micro: int | float | None) -> str:
    if micro is None:
        return "-"
    return f"{micro / 1_000_000:,.6f}".rstrip("0").rstrip(".")


@dataclass
class Console:
    """The console's view of the gateway: its settings, deps, templates and session codec."""

    settings: GatewaySettings
    deps: GatewayDeps
    codec: SessionCodec
    templates: Jinja2Templates

    @classmethod
    def build(cls, settings: GatewaySettings, deps: GatewayDeps) -> Console:
        templates = Jinja2Templates(directory=str(HERE / "templates"))
        templates.env.filters["credits"] = credits
        templates.env.filters["gpu_time"] = gpu_time
        return cls(settings, deps, SessionCodec(settings.secret_key.encode()), templates)

    @property
    def usage(self) -> UsageRollups:
        if self.deps.usage is None:
            raise Problem("The console's usage store is not configured.", 503)
        return self.deps.usage

    def render(
        self,
        request: Request,
        name: str,
        context: dict[str, Any],
        status: int = 200,
        session: Session | None = None,
    ) -> HTMLResponse:
        ctx = {"session": session, "csrf": self.codec.csrf(session) if session else "", **context}
        response = self.templates.TemplateResponse(request, name, ctx, status_code=status)
        response.headers.update(SECURITY_HEADERS)
        return response

    def problem(self, request: Request, problem: Problem, session: Session | None) -> HTMLResponse:
        return self.render(request, "message.html", {"error": problem.message}, problem.status, session)

    @property
    def sessions(self) -> ConsoleSessions:
        if self.deps.sessions is None:
            raise Problem("The console's session store is not configured.", 503)
        return self.deps.sessions

    async def session(self, request: Request) -> Session | None:
        """The request's valid session: signed, unexpired and not signed out (its id still on the
        server); a key-scoped one ends as soon as its key is revoked or expires."""
        session = self.codec.decode(request.cookies.get(COOKIE), time.time())
        if session is None or self.deps.sessions is None:
            return None
        if not await self.deps.sessions.alive(session.nonce):
            return None
        if session.kind != "key":
            return session
        assert session.team_id is not None
        keys = {k.id: k for k in await self.deps.keys.list_keys(session.team_id)}
        key = keys.get(session.key_id or -1)
        if key is None or key.revoked_at is not None:
            return None
        if key.expires_at is not None and key.expires_at <= self.deps.clock():
            return None
        return session

    async def checked_form(self, request: Request, session: Session) -> dict[str, list[str]]:
        form = await read_form(request)
        if not self.codec.csrf_ok(session, first(form, "csrf")):
            raise Problem("This form has expired or did not come from this console; reload the page.", 403)
        return form


def to_signin() -> Response:
    return RedirectResponse("/console/signin", status_code=303)


def csv_response(filename: str, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> Response:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header)
    writer.writerows(rows)
    return Response(
        out.getvalue(),
        media_type="text/csv; charset=utf-8",
        headers={"content-disposition": f'attachment; filename="{filename}"', **SECURITY_HEADERS},
    )
