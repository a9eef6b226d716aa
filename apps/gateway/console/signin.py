"""Sign-in and sign-out: a pasted token (JWT or API key), or a one-time link (`llmfleet dev`).

Both verify the token with the API's own check (`authenticate_token`) and turn the
principal into a session cookie; the token itself is never stored in the cookie. The link
form (`GET /console/signin?token=...`) works once: the token's SHA-256 is recorded at
first use, and the response redirects at once so the token leaves the address bar.
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from apps.core.errors import LlmfleetError
from apps.core.identity.principal import Principal
from apps.gateway.auth import authenticate_token
from apps.gateway.console.forms import Problem, first, read_form
from apps.gateway.console.session import MAX_SESSION_S, Session, clear_cookie, set_cookie
from apps.gateway.console.views import SECURITY_HEADERS, Console


def _session(console: Console, principal: Principal) -> Session:
    now = int(time.time())
    expires = now + MAX_SESSION_S
    if principal.expires_at is not None:
        expires = min(expires, int(principal.expires_at.timestamp()))
    if principal.is_admin:
        return console.codec.new("admin", principal.subject, principal.team_id, None, expires)
    if principal.team_id is None:
        raise Problem("This identity belongs to no team, so there is nothing to show.", 403)
    if principal.kind == "api_key":
        return console.codec.new("key", principal.subject, principal.team_id, principal.key_id, expires)
    return console.codec.new("team", principal.subject, principal.team_id, None, expires)


def signin_routes(console: Console) -> list[Route]:
    async def start(request: Request, token: str, *, one_time: bool = False) -> Response:
        try:
            principal = await authenticate_token(token, console.deps, console.settings)
        except LlmfleetError as exc:
            raise Problem(f"Sign-in failed: {exc.message}", 401) from None
        # Only a verified token is recorded, so junk links cannot fill the table.
        if one_time and not await console.usage.claim_signin(token):
            raise Problem("This sign-in link was already used; ask for a new one or paste a token.", 401)
        session = _session(console, principal)
        response = RedirectResponse(
            "/console/admin" if session.is_admin else "/console/team", status_code=303
        )
        response.headers.update(SECURITY_HEADERS)
        set_cookie(
            response, request, console.codec.encode(session), max(1, session.expires - int(time.time()))
        )
        return response

    async def signin_page(request: Request) -> Response:
        token = request.query_params.get("token", "").strip()
        try:
            if token:
                return await start(request, token, one_time=True)
            return console.render(request, "signin.html", {})
        except Problem as problem:
            return console.render(request, "signin.html", {"error": problem.message}, problem.status)

    async def signin_post(request: Request) -> Response:
        try:
            token = first(await read_form(request), "token")
            if not token:
                raise Problem("Paste an API key or a JWT to sign in.")
            return await start(request, token)
        except Problem as problem:
            return console.render(request, "signin.html", {"error": problem.message}, problem.status)

    async def signout(request: Request) -> Response:
        session = await console.session(request)
        if session is not None:
            try:
                await console.checked_form(request, session)
            except Problem as problem:
                return console.problem(request, problem, session)
        response = RedirectResponse("/console/signin", status_code=303)
        clear_cookie(response, request)
        return response

    return [
        Route("/signin", signin_page, methods=["GET"]),
        Route("/signin", signin_post, methods=["POST"]),
        Route("/signout", signout, methods=["POST"]),
    ]
