"""Signing in to the console as a browser does: load the form (its pre-session CSRF cookie and
token), then post the token through it."""

from __future__ import annotations

import re

import httpx


def signin_csrf_of(html: str) -> str:
    found = re.search(r'name="signin_csrf" value="([^"]+)"', html)
    assert found, "no sign-in CSRF token on the page"
    return found.group(1)


async def signin(c: httpx.AsyncClient, token: str) -> httpx.Response:
    page = await c.get("/console/signin")
    assert page.status_code == 200, page.text
    return await c.post("/console/signin", data={"token": token, "signin_csrf": signin_csrf_of(page.text)})
