"""Console sessions: an HMAC-signed cookie naming the verified principal, and its CSRF token.

The cookie holds no credential: the kind of session, the team id and key id the sign-in
verified, an expiry and a random nonce, signed with a key derived from the server key. A
team id therefore only ever comes from a verified principal, never from a URL or a form.
The nonce is also the session's id on the server (`ConsoleSessions`): sign-out deletes it, so
the cookie (and its CSRF token) then fails everywhere. The CSRF token is an HMAC of the nonce
under a second derived key, rendered into every state-changing form and checked on every POST.

The sign-in form has its own pre-session token (login CSRF): a random value in a `SameSite=Strict`
cookie scoped to `/console/signin`, and its HMAC under a third derived key in the form.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import asdict, dataclass
from typing import Literal

from starlette.requests import Request
from starlette.responses import Response

COOKIE = "lf_console"
SIGNIN_COOKIE = "lf_signin"  # the sign-in form's pre-session CSRF value
SIGNIN_PATH = "/console/signin"
SIGNIN_FORM_S = 3600  # how long a rendered sign-in form stays usable
MAX_SESSION_S = 8 * 3600
Kind = Literal["team", "key", "admin"]


@dataclass(frozen=True)
class Session:
    kind: Kind
    subject: str
    team_id: int | None
    key_id: int | None
    expires: int  # Unix seconds
    nonce: str

    @property
    def is_admin(self) -> bool:
        return self.kind == "admin"

    @property
    def manages_keys(self) -> bool:
        """A team's IdP identity administers its keys; a key-scoped session only reads."""
        return self.kind == "team"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class SessionCodec:
    def __init__(self, server_key: bytes) -> None:
        self._sign = hmac.new(server_key, b"llmfleet-console-session", hashlib.sha256).digest()
        self._csrf = hmac.new(server_key, b"llmfleet-console-csrf", hashlib.sha256).digest()
        self._signin = hmac.new(server_key, b"llmfleet-console-signin-csrf", hashlib.sha256).digest()

    def new(self, kind: Kind, subject: str, team_id: int | None, key_id: int | None, expires: int) -> Session:
        return Session(kind, subject, team_id, key_id, expires, secrets.token_urlsafe(16))

    def encode(self, session: Session) -> str:
        body = _b64(json.dumps(asdict(session), separators=(",", ":")).encode())
        mac = _b64(hmac.new(self._sign, body.encode(), hashlib.sha256).digest())
        return f"{body}.{mac}"

    def decode(self, raw: str | None, now: float) -> Session | None:
        if not raw or raw.count(".") != 1:
            return None
        body, mac = raw.split(".")
        want = _b64(hmac.new(self._sign, body.encode(), hashlib.sha256).digest())
        if not hmac.compare_digest(mac, want):
            return None
        try:
            data = json.loads(_unb64(body))
            session = Session(**data)
        except (ValueError, TypeError):
            return None
        return session if session.expires > now else None

    def csrf(self, session: Session) -> str:
        return _b64(hmac.new(self._csrf, session.nonce.encode(), hashlib.sha256).digest())

    def csrf_ok(self, session: Session, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(str(token), self.csrf(session))

    def signin_csrf(self, value: str) -> str:
        """The sign-in form's token for the pre-session cookie's `value`."""
        return _b64(hmac.new(self._signin, value.encode(), hashlib.sha256).digest())

    def signin_csrf_ok(self, cookie: str | None, token: str | None) -> bool:
        return bool(cookie) and bool(token) and hmac.compare_digest(str(token), self.signin_csrf(str(cookie)))


def behind_tls(request: Request) -> bool:
    return request.url.scheme == "https" or request.headers.get("x-forwarded-proto", "") == "https"


def set_cookie(response: Response, request: Request, value: str, max_age: int) -> None:
    response.set_cookie(
        COOKIE,
        value,
        max_age=max_age,
        path="/console",
        httponly=True,
        secure=behind_tls(request),
        samesite="lax",
    )


def clear_cookie(response: Response, request: Request) -> None:
    response.delete_cookie(COOKIE, path="/console", httponly=True, secure=behind_tls(request), samesite="lax")


def set_signin_cookie(response: Response, request: Request, value: str) -> None:
    response.set_cookie(
        SIGNIN_COOKIE,
        value,
        max_age=SIGNIN_FORM_S,
        path=SIGNIN_PATH,
        httponly=True,
        secure=behind_tls(request),
        samesite="strict",
    )


def clear_signin_cookie(response: Response, request: Request) -> None:
    response.delete_cookie(
        SIGNIN_COOKIE, path=SIGNIN_PATH, httponly=True, secure=behind_tls(request), samesite="strict"
    )
