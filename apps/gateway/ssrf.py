"""The SSRF guard: no URL in a request body may point the engine (or anything it calls) inward.

Checked, at any depth of the body:
* every string that is a URL (`scheme://...` or `data:...`, the whole string), wherever it is;
* every value under a URL-ish key (`url`, `*_url`, `*Url`, `uri`, `href`, `src`, `image`,
  `$ref`, case-insensitive), whatever its shape: a string must be a URL, a list or an object is
  walked and each of its strings checked the same way.
The one exemption is prompt text (a message's string `content`, a `text` part): no part of the
platform fetches it, and refusing a prompt that is just a URL would only get in users' way.

A URL passes if it is `data:`, or `http(s)` to a public address. Refused rather than parsed one
way (parsers disagree on them: `http://127.0.0.1\\@8.8.8.8/` is 8.8.8.8 to `urlsplit` and
127.0.0.1 to urllib3): backslashes, userinfo (`@` before the host), whitespace, control or
non-ASCII characters, `%` in the host, and numeric hosts that are not a dotted quad (`2130706433`,
`0x7f.1`). Hostnames are resolved and every address must be public; a name that does not resolve
is refused (fail closed). Not public: private, loopback, link-local, multicast, reserved,
unspecified, and the IPv6 ranges that embed or tunnel to an IPv4 address (IPv4-mapped and
-compatible `::/96`, 6to4 `2002::/16`, NAT64 `64:ff9b::/96` and `64:ff9b:1::/48`, Teredo
`2001::/32`), refused whatever IPv4 address they carry.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
from typing import Any
from urllib.parse import urlsplit

from apps.core.errors import InvalidRequest
from apps.gateway.ports import Resolver

MAX_WALK_DEPTH = 32
URLISH_KEYS = frozenset({"url", "uri", "href", "src", "image", "$ref"})
URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]{0,31}://")
SAFE_URL_CHARS = re.compile(r"^[\x21-\x7e]*$")  # printable ASCII, no space
# Every label a number (decimal, octal or 0x-hex): what inet_aton reads as an IPv4 address.
NUMERIC_HOST = re.compile(r"^(0[xX][0-9a-fA-F]*|[0-9]+)(\.(0[xX][0-9a-fA-F]*|[0-9]+))*\.?$")
TUNNEL_NETS = tuple(
    ipaddress.ip_network(n)
    for n in ("::/96", "::ffff:0:0/96", "2002::/16", "64:ff9b::/96", "64:ff9b:1::/48", "2001::/32")
)


def _urlish_key(key: str) -> bool:
    lowered = key.lower()
    return (
        lowered in URLISH_KEYS or lowered.endswith("_url") or key.endswith("Url") or lowered.endswith("_uri")
    )


def _is_url(text: str) -> bool:
    stripped = text.strip()
    return bool(URL_RE.match(stripped)) or stripped[:5].lower() == "data:"


def url_values(
    node: Any, path: str = "", depth: int = 0, *, under_url_key: bool = False
) -> list[tuple[str, str]]:
    """(param path, string) of every string to check as a URL."""
    if depth > MAX_WALK_DEPTH:
        raise InvalidRequest("The request body is nested too deeply.", param=path or None)
    found: list[tuple[str, str]] = []
    if isinstance(node, str):
        if under_url_key or _is_url(node):
            found.append((path, node))
    elif isinstance(node, dict):
        for key, value in node.items():
            sub = f"{path}.{key}" if path else str(key)
            if _is_prompt_text(str(key), value, node):
                continue
            found.extend(
                url_values(value, sub, depth + 1, under_url_key=under_url_key or _urlish_key(str(key)))
            )
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found.extend(url_values(value, f"{path}.{i}", depth + 1, under_url_key=under_url_key))
    return found


def _is_prompt_text(key: str, value: Any, parent: dict[str, Any]) -> bool:
    if not isinstance(value, str):
        return False
    return (key == "content" and isinstance(parent.get("role"), str)) or (
        key == "text" and parent.get("type") == "text"
    )


def is_public_ip(text: str) -> bool:
    try:
        ip = ipaddress.ip_address(text.split("%")[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and any(ip in net for net in TUNNEL_NETS):
        return False
    return not (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
        or not ip.is_global
    )


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    return True


def _host(url: str, param: str) -> str:
    """The host of an http(s) URL that every parser reads the same way, else a 400."""
    if not SAFE_URL_CHARS.match(url) or "\\" in url:
        raise InvalidRequest(
            f"Ambiguous URL in '{param}' (backslash, space or non-ASCII); refused.", param=param
        )
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https"):
        raise InvalidRequest(f"URL scheme not allowed in '{param}' (http, https or data only).", param=param)
    if "@" in parts.netloc:
        raise InvalidRequest(f"URL with userinfo in '{param}'; refused.", param=param)
    host = parts.hostname
    if not host or "%" in host:
        raise InvalidRequest(f"URL without a usable host in '{param}'.", param=param)
    if NUMERIC_HOST.match(host) and not _is_ip_literal(host):
        raise InvalidRequest(f"Numeric host in '{param}' is not a dotted-quad address; refused.", param=param)
    try:
        parts.port  # noqa: B018 (a port out of range raises here)
    except ValueError:
        raise InvalidRequest(f"Invalid port in '{param}'.", param=param) from None
    return host


async def check_ssrf(body: dict[str, Any], resolver: Resolver, timeout_s: float = 2.0) -> None:
    for param, url in url_values(body):
        if url.strip()[:5].lower() == "data:":
            continue
        host = _host(url, param)
        try:
            addresses = (
                [host] if _is_ip_literal(host) else await asyncio.wait_for(resolver.resolve(host), timeout_s)
            )
        except (OSError, TimeoutError, UnicodeError):
            raise InvalidRequest(f"The host in '{param}' does not resolve.", param=param) from None
        if not addresses or not all(is_public_ip(a) for a in addresses):
            raise InvalidRequest(f"'{param}' points at an internal address; refused.", param=param)


class SystemResolver:
    async def resolve(self, host: str) -> list[str]:
        infos = await asyncio.get_running_loop().getaddrinfo(host, None)
        return [str(info[4][0]) for info in infos]
