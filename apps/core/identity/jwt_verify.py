"""JWT verification against a JWKS URL (PyJWT's `PyJWKClient`, keys cached).

Security rules (brief "Security checks"): only asymmetric algorithms from an allowlist
(`none` and every HS* are refused even if listed, so a public key can never be used as an
HMAC secret); issuer, audience, `exp` and `sub` are required; the team comes from a
configurable claim and the admin role from another. There is no shared-secret mode.

Team mapping is explicit (never guessed from a value's shape): the `team_id` claim (configurable)
is a team's integer id, the `team` claim a team's name (a string, even "2"); a token carrying a
`team_id` that is not an integer, or a non-string `team`, is refused. The model allowlist comes
from the `models` claim (configurable): a list of model names (or one space-separated string);
without the claim the caller may use every model, an empty list allows none.

`PyJWKClient` fetches with urllib (blocking), so lookups run in a worker thread; the JWK
set is cached for `cache_s` and refetched once when a token names an unknown `kid`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jwt

from apps.core.errors import AuthenticationFailed, InvalidRequest
from apps.core.sharing import PriorityClass, priority_class

SAFE_ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)


@dataclass(frozen=True)
class JwtIdentity:
    subject: str
    team: str | None  # a team's name
    is_admin: bool
    claims: dict[str, Any]
    team_id: int | None = None  # a team's id
    models: tuple[str, ...] | None = None  # None: no models claim (every model)
    priority_class: PriorityClass = PriorityClass.INTERACTIVE  # the class claim (absent: interactive)


def looks_like_jwt(token: str) -> bool:
    return token.count(".") == 2 and token.startswith("eyJ")


class JwtVerifier:
    def __init__(
        self,
        jwks_url: str,
        *,
        issuer: str,
        audience: str,
        algorithms: Sequence[str] = ("RS256", "ES256"),
        team_claim: str = "team",
        team_id_claim: str = "team_id",
        models_claim: str = "models",
        admin_claim: str = "roles",
        admin_role: str = "admin",
        class_claim: str = "priority_class",
        cache_s: int = 300,
        leeway_s: float = 30.0,
    ) -> None:
        unsafe = [a for a in algorithms if a not in SAFE_ALGORITHMS]
        if unsafe:
            raise ValueError(f"JWT algorithms not allowed (asymmetric only): {', '.join(unsafe)}")
        if not issuer or not audience:
            raise ValueError("JWT issuer and audience are required")
        self._algorithms = list(algorithms)
        self._issuer = issuer
        self._audience = audience
        self._team_claim = team_claim
        self._team_id_claim = team_id_claim
        self._class_claim = class_claim
        self._models_claim = models_claim
        self._admin_claim = admin_claim
        self._admin_role = admin_role
        self._leeway = leeway_s
        self._jwks = jwt.PyJWKClient(jwks_url, cache_jwk_set=True, lifespan=cache_s, timeout=5)

    async def verify(self, token: str) -> JwtIdentity:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise AuthenticationFailed("Malformed bearer token.") from None
        if header.get("alg") not in self._algorithms:
            raise AuthenticationFailed(
                f"JWT algorithm {header.get('alg')!r} is not allowed.", code="invalid_jwt"
            )
        try:
            signing = await asyncio.to_thread(self._jwks.get_signing_key_from_jwt, token)
        except jwt.PyJWKClientConnectionError:
            raise AuthenticationFailed(
                "JWKS endpoint unreachable; cannot verify token.", code="jwks_unavailable"
            ) from None
        except jwt.PyJWTError:
            raise AuthenticationFailed("JWT signing key not found in JWKS.", code="invalid_jwt") from None
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                signing.key,
                algorithms=self._algorithms,
                audience=self._audience,
                issuer=self._issuer,
                leeway=self._leeway,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except jwt.ExpiredSignatureError:
            raise AuthenticationFailed("The token has expired.", code="expired_jwt") from None
        except jwt.PyJWTError as exc:
            raise AuthenticationFailed(f"Invalid token: {exc}", code="invalid_jwt") from None
        roles = claims.get(self._admin_claim)
        if isinstance(roles, str):
            roles = roles.split()
        is_admin = isinstance(roles, list) and self._admin_role in roles
        team, team_id = claims.get(self._team_claim), claims.get(self._team_id_claim)
        if team is not None and not isinstance(team, str):
            raise AuthenticationFailed(
                f"The '{self._team_claim}' claim must be a team name.", code="invalid_jwt"
            )
        if team_id is not None and (isinstance(team_id, bool) or not isinstance(team_id, int)):
            raise AuthenticationFailed(
                f"The '{self._team_id_claim}' claim must be an integer team id.", code="invalid_jwt"
            )
        if team is not None and team_id is not None:
            raise AuthenticationFailed("The token names its team twice (id and name).", code="invalid_jwt")
        return JwtIdentity(
            subject=str(claims["sub"]),
            team=team,
            is_admin=is_admin,
            claims=claims,
            team_id=team_id,
            models=self._models(claims.get(self._models_claim)),
            priority_class=self._class(claims.get(self._class_claim)),
        )

    def _class(self, raw: Any) -> PriorityClass:
        try:
            return priority_class(raw, self._class_claim)
        except InvalidRequest:
            raise AuthenticationFailed(
                f"The '{self._class_claim}' claim must be 'interactive' or 'batch'.", code="invalid_jwt"
            ) from None

    def _models(self, raw: Any) -> tuple[str, ...] | None:
        if raw is None:
            return None
        if isinstance(raw, str):
            raw = raw.split()
        if not isinstance(raw, list) or not all(isinstance(m, str) for m in raw):
            raise AuthenticationFailed(
                f"The '{self._models_claim}' claim must be a list of model names.", code="invalid_jwt"
            )
        return tuple(raw)
