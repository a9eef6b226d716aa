"""JWT verification via JWKS from the local issuer: the algorithm allowlist and claim checks."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from apps.core.errors import AuthenticationFailed
from apps.core.identity.jwt_verify import JwtVerifier, looks_like_jwt
from apps.core.identity.local_issuer import LocalIssuer
from apps.core.identity.principal import Principal
from apps.core.quota.admission import Limits


@pytest.fixture(scope="module")
def issuer() -> Iterator[tuple[LocalIssuer, str]]:
    iss = LocalIssuer.generate()
    url = iss.serve()
    yield iss, url
    iss.stop()


def verifier(url: str, iss: LocalIssuer) -> JwtVerifier:
    return JwtVerifier(url, issuer=iss.issuer, audience=iss.audience)


async def test_valid_admin_and_team_tokens(issuer: tuple[LocalIssuer, str]) -> None:
    iss, url = issuer
    v = verifier(url, iss)
    admin = await v.verify(iss.mint("ops", admin=True))
    assert admin.is_admin
    assert admin.subject == "ops"
    assert admin.team is None
    user = await v.verify(iss.mint("u", team="ml"))
    assert not user.is_admin
    assert user.team == "ml"
    assert looks_like_jwt(iss.mint("x"))
    assert not looks_like_jwt("sk-lf-abc")


@pytest.mark.parametrize(
    ("extra", "code"),
    [
        ({"aud": "other"}, "invalid_jwt"),
        ({"iss": "evil"}, "invalid_jwt"),
        ({"exp": int(time.time()) - 3600}, "expired_jwt"),
    ],
)
async def test_wrong_claims_refused(
    issuer: tuple[LocalIssuer, str], extra: dict[str, object], code: str
) -> None:
    iss, url = issuer
    with pytest.raises(AuthenticationFailed) as err:
        await verifier(url, iss).verify(iss.mint("u", extra=extra))
    assert err.value.code == code


async def test_alg_none_and_hs256_with_public_key_refused(issuer: tuple[LocalIssuer, str]) -> None:
    iss, url = issuer
    header = (
        base64.urlsafe_b64encode(json.dumps({"alg": "none", "kid": iss.kid}).encode()).rstrip(b"=").decode()
    )
    claims = {
        "sub": "x",
        "iss": iss.issuer,
        "aud": iss.audience,
        "exp": int(time.time()) + 60,
        "roles": ["admin"],
    }
    payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    with pytest.raises(AuthenticationFailed):
        await verifier(url, iss).verify(f"{header}.{payload}.")
    # Key confusion: HMAC-sign with the PEM of the public key.
    pem = iss._key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    hs_header = (
        base64.urlsafe_b64encode(json.dumps({"alg": "HS256", "kid": iss.kid}).encode()).rstrip(b"=").decode()
    )
    signing_input = f"{hs_header}.{payload}".encode()
    sig = (
        base64.urlsafe_b64encode(hmac.new(pem, signing_input, hashlib.sha256).digest()).rstrip(b"=").decode()
    )
    forged = f"{hs_header}.{payload}.{sig}"
    with pytest.raises(AuthenticationFailed):
        await verifier(url, iss).verify(forged)


async def test_token_from_another_issuer_key_refused(issuer: tuple[LocalIssuer, str]) -> None:
    iss, url = issuer
    other = LocalIssuer.generate()
    with pytest.raises(AuthenticationFailed):
        await verifier(url, iss).verify(other.mint("u", admin=True))


def test_symmetric_algorithms_cannot_be_configured() -> None:
    with pytest.raises(ValueError, match="HS256"):
        JwtVerifier("http://127.0.0.1:1/jwks", issuer="i", audience="a", algorithms=["RS256", "HS256"])
    with pytest.raises(ValueError, match="none"):
        JwtVerifier("http://127.0.0.1:1/jwks", issuer="i", audience="a", algorithms=["none"])


def test_issuer_key_persists(tmp_path: Path) -> None:
    path = tmp_path / "issuer.pem"
    first = LocalIssuer.load_or_create(path)
    second = LocalIssuer.load_or_create(path)
    assert first.kid == second.kid
    assert oct(path.stat().st_mode & 0o777) == "0o600"


async def test_models_claim_gives_jwt_callers_an_allowlist(issuer: tuple[LocalIssuer, str]) -> None:
    """Issue 21: on main every JWT caller could use every model."""
    iss, url = issuer
    v = verifier(url, iss)
    listed = await v.verify(iss.mint("u", team="ml", extra={"models": ["a", "b"]}))
    assert listed.models == ("a", "b")
    spaced = await v.verify(iss.mint("u", team="ml", extra={"models": "a c"}))
    assert spaced.models == ("a", "c")
    assert (await v.verify(iss.mint("u", team="ml"))).models is None
    none_allowed = await v.verify(iss.mint("u", team="ml", extra={"models": []}))
    assert none_allowed.models == ()
    restricted = Principal("jwt", "jwt-u", 1, "ml", None, (), Limits(), models_restricted=True)
    assert not restricted.may_use("a")
    assert Principal("jwt", "jwt-u", 1, "ml", None, ("a",), Limits(), models_restricted=True).may_use("a")
    with pytest.raises(AuthenticationFailed):
        await v.verify(iss.mint("u", extra={"models": [1, 2]}))


async def test_team_claims_are_typed_never_guessed(issuer: tuple[LocalIssuer, str]) -> None:
    iss, url = issuer
    v = verifier(url, iss)
    by_name = await v.verify(iss.mint("u", team="2"))
    assert (by_name.team, by_name.team_id) == ("2", None)
    by_id = await v.verify(iss.mint("u", extra={"team_id": 2}))
    assert (by_id.team, by_id.team_id) == (None, 2)
    for extra in ({"team_id": "2"}, {"team_id": True}, {"team": 2}, {"team": "a", "team_id": 1}):
        with pytest.raises(AuthenticationFailed):
            await v.verify(iss.mint("u", extra=extra))
