"""Console sessions and sign-in links: signed, expiring, CSRF bound to the session."""

from __future__ import annotations

import time
from urllib.parse import parse_qs, urlsplit

import jwt

from apps.cli.console_links import console_links
from apps.core.identity.local_issuer import LocalIssuer
from apps.gateway.console.session import SessionCodec


def test_a_session_round_trips_and_any_change_breaks_it() -> None:
    codec = SessionCodec(b"server-key")
    session = codec.new("team", "alice", 7, None, int(time.time()) + 60)
    raw = codec.encode(session)
    assert codec.decode(raw, time.time()) == session
    body, mac = raw.split(".")
    forged = SessionCodec(b"other-key").encode(session)
    assert codec.decode(forged, time.time()) is None
    assert codec.decode(body + "." + mac[::-1], time.time()) is None
    assert codec.decode(body[:-2] + "AA." + mac, time.time()) is None
    assert codec.decode("garbage", time.time()) is None
    assert codec.decode(raw, session.expires + 1) is None


def test_the_sign_in_form_token_belongs_to_its_cookie() -> None:
    codec = SessionCodec(b"server-key")
    assert codec.signin_csrf_ok("cookie-a", codec.signin_csrf("cookie-a"))
    assert not codec.signin_csrf_ok("cookie-b", codec.signin_csrf("cookie-a"))
    assert not codec.signin_csrf_ok(None, codec.signin_csrf("cookie-a"))
    assert not codec.signin_csrf_ok("cookie-a", None)
    assert not codec.signin_csrf_ok("cookie-a", SessionCodec(b"other").signin_csrf("cookie-a"))


def test_csrf_token_belongs_to_one_session() -> None:
    codec = SessionCodec(b"server-key")
    a = codec.new("team", "alice", 7, None, 2**40)
    b = codec.new("team", "alice", 7, None, 2**40)
    assert codec.csrf_ok(a, codec.csrf(a))
    assert not codec.csrf_ok(a, codec.csrf(b))
    assert not codec.csrf_ok(a, "")
    assert not codec.csrf_ok(a, None)


def test_dev_links_carry_distinct_short_lived_tokens_in_the_fragment() -> None:
    """Issue 27: the link's token was valid 24 h and sent to the server in the query string."""
    issuer = LocalIssuer.generate()
    links = console_links("http://127.0.0.1:8080", issuer, "demo")
    assert links.url == "http://127.0.0.1:8080/console/"
    claims = []
    for link in (links.team, links.admin):
        parts = urlsplit(link)
        assert parts.path == "/console/signin"
        assert not parts.query  # browsers never send a fragment: no server log holds the token
        token = parse_qs(parts.fragment)["token"][0]
        claims.append(jwt.decode(token, options={"verify_signature": False}))
    assert claims[0]["team"] == "demo"
    assert "roles" not in claims[0]
    assert claims[1]["roles"] == ["admin"]
    assert claims[0]["jti"] != claims[1]["jti"]
    assert all(c["exp"] - c["iat"] <= 15 * 60 for c in claims)
    assert links.lines("demo")[1].endswith(links.team)


def test_capacity_counts_ready_nodes_against_the_plan() -> None:
    from apps.gateway.console.admin import capacity

    plan = {"m8": (64, 2, 100), "m70": (16, 0, 0)}
    nodes: list[dict[str, object]] = [
        {"models": ["m8"], "state": "ready", "in_flight": 3},
        {"models": ["m8"], "state": "draining", "in_flight": 2},
        {"models": ["m8"], "state": "ready", "in_flight": 0},
        {"models": [], "state": "ready", "in_flight": 0},
    ]
    assert capacity(plan, nodes) == [("m70", 0, 0, 0, 0, 0), ("m8", 2, 128, 5, 2, 100)]
