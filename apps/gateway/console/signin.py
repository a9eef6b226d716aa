"""Sign-in and sign-out: a token (JWT or API key) posted by the sign-in form, never read from a URL.

The token is verified with the API's own check (`authenticate_token`) and the principal becomes a
server-side session (`ConsoleSessions`) named by a signed cookie; the token is never stored. The
form is protected against login CSRF: a cross-site POST (`Sec-Fetch-Site`/`Origin`) or one
without the form's pre-session token is refused with 403. A JWT carrying a `jti` (every one-time
link of `llmfleet dev`) signs in once: its issuer and `jti` are recorded at first use, atomically,
whichever way it arrives. `GET /console/signin?token=...` accepts nothing: the page says to use
the form (a link carries its token in the URL fragment, which browsers never send; the page's
script moves it into the form and posts it). Sign-out deletes the session on the server.
"""

from __future__ import annotations

import secrets
import time
from urllib.parse import urlsplit

import jwt
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from apps.core.errors import LlmfleetError
from apps.core.identity.jwt_verify import looks_like_jwt
from apps.core.identity.principal import Principal
from apps.gateway.auth import authenticate_token
from apps.gateway.console.forms import Problem, first, read_form
from apps.gateway.console.session import (
    MAX_SESSION_S,
    SIGNIN_COOKIE,
    Session,
    clear_cookie,
    clear_signin_cookie,
    set_cookie,
    set_signin_cookie,
)
from apps.gateway.console.views import SECURITY_HEADERS, Console

CROSS_SITE = (
    "This sign-in did not come from this console's own form (a cross-site request); "
    "open the sign-in page and sign in there."
)
NOT_IN_URL = (
    "Tokens are not accepted in the address (it ends up in logs and history); nothing was signed in. "
    "Paste the token into the form below."
)


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


def same_origin(request: Request) -> bool:
    """False for a request the browser marks as coming from another site: `Sec-Fetch-Site`, or for
    a browser without it, an `Origin` naming another host. (`Origin: null` is what the console's own
    form sends under `Referrer-Policy: no-referrer`; the form's token is what refuses the rest.)"""
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None:
        return fetch_site in ("same-origin", "none")
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return True
    return urlsplit(origin).netloc == request.headers.get("host", "")


def _one_use_id(token: str) -> str | None:
    """A verified JWT's issuer and `jti` (read after `authenticate_token` checked the signature)."""
    if not looks_like_jwt(token):
        return None
    claims = jwt.decode(token, options={"verify_signature": False})
    jti = claims.get("jti")
    return f"jti:{claims.get('iss')}:{jti}" if isinstance(jti, str) and jti else None


class SigninView:
    """Sign-in and sign-out routes: each a method, `routes()` their table."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def routes(self) -> list[Route]:
        return [
            Route("/signin", self.signin_page, methods=["GET"]),
            Route("/signin", self.signin_post, methods=["POST"]),
            Route("/signout", self.signout, methods=["POST"]),
        ]

    def form_page(self, request: Request, error: str | None = None, status: int = 200) -> Response:
        value = secrets.token_urlsafe(16)
        context = {"error": error, "signin_csrf": self.console.codec.signin_csrf(value)}
        response = self.console.render(request, "signin.html", context, status)
        set_signin_cookie(response, request, value)
        return response

    async def start(self, request: Request, token: str) -> Response:
        console = self.console
        try:
            principal = await authenticate_token(token, console.deps, console.settings)
        except LlmfleetError as exc:
            raise Problem(f"Sign-in failed: {exc.message}", 401) from None
        session = _session(console, principal)
        # Only a verified token is recorded, so junk cannot fill the table.
        one_use = _one_use_id(token)
        if one_use is not None and not await console.usage.claim_signin(one_use):
            raise Problem(
                "This sign-in token was already used; ask for a new link or paste a fresh token.", 401
            )
        await console.sessions.open(session.nonce, session.expires)
        response = RedirectResponse(
            "/console/admin" if session.is_admin else "/console/team", status_code=303
        )
        response.headers.update(SECURITY_HEADERS)
        set_cookie(
            response, request, console.codec.encode(session), max(1, session.expires - int(time.time()))
        )
        clear_signin_cookie(response, request)
        return response

    async def signin_page(self, request: Request) -> Response:
        if "token" in request.query_params:  # never verified, never logged, never kept
            return self.form_page(request, NOT_IN_URL, 400)
        return self.form_page(request)

    async def signin_post(self, request: Request) -> Response:
        try:
            form = await read_form(request)
            if not same_origin(request) or not self.console.codec.signin_csrf_ok(
                request.cookies.get(SIGNIN_COOKIE), first(form, "signin_csrf")
            ):
                raise Problem(CROSS_SITE, 403)
            token = first(form, "token")
            if not token:
                raise Problem("Paste an API key or a JWT to sign in.")
            return await self.start(request, token)
        except Problem as problem:
            return self.form_page(request, problem.message, problem.status)

    async def signout(self, request: Request) -> Response:
        session = await self.console.session(request)
        if session is not None:
            try:
                await self.console.checked_form(request, session)
            except Problem as problem:
                return self.console.problem(request, problem, session)
            await self.console.sessions.revoke(session.nonce)
        response = RedirectResponse("/console/signin", status_code=303)
        clear_cookie(response, request)
        return response


def signin_routes(console: Console) -> list[Route]:
    return SigninView(console).routes()
