"""The SSRF guard: no URL the engine fetches may point it (or anything it calls) inward.

Checked exactly where vLLM fetches media: in every message's `content` array, the parts that carry
a URL, by vLLM's own parsing (`vllm/entrypoints/chat_utils.py`, `MM_PARSER_MAP` and the parts
without a `type`): `image_url`, `audio_url` and `video_url` (an object's `url`, or the string
itself), and the Responses-style `input_image` part's `image_url` string. `input_audio` carries
base64 data (vLLM makes it a `data:` URL) and is fetched by no one. Nothing else in a body is
fetched by the engine: a tool's JSON schema (parameters named `url`, `image`, `src`, `href`, a
`$ref`), a `response_format` schema, prompt text or metadata are never inspected, so legitimate
tool definitions are not refused. A fetched part whose URL is neither a string nor absent is a 400
(vLLM would refuse it too, after the money and the slot were taken).

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

MAX_WALK_DEPTH = 32  # the deepest JSON body accepted at all (`apps.gateway.validate`)
# The keys of a content part under which vLLM finds a URL to fetch: `{"url": ...}` or the URL itself
# (`input_image` and the parts without a `type` give it as a string).
FETCHED_PARTS = ("image_url", "audio_url", "video_url")
SAFE_URL_CHARS = re.compile(r"^[\x21-\x7e]*$")  # printable ASCII, no space
# Every label a number (decimal, octal or 0x-hex): what inet_aton reads as an IPv4 address.
NUMERIC_HOST = re.compile(r"^(0[xX][0-9a-fA-F]*|[0-9]+)(\.(0[xX][0-9a-fA-F]*|[0-9]+))*\.?$")
TUNNEL_NETS = tuple(
    ipaddress.ip_network(n)
    for n in ("::/96", "::ffff:0:0/96", "2002::/16", "64:ff9b::/96", "64:ff9b:1::/48", "2001::/32")
)


def _part_urls(part: dict[str, Any], path: str) -> list[tuple[str, str]]:
    """(param path, URL) of what the engine would fetch for one content part."""
    found: list[tuple[str, str]] = []
    for key in FETCHED_PARTS:
        if key not in part:
            continue
        value = part[key]
        if isinstance(value, dict):
            value, sub = value.get("url"), f"{path}.{key}.url"
        else:
            sub = f"{path}.{key}"
        if value is None:
            continue
        if not isinstance(value, str):
            raise InvalidRequest(f"'{sub}' must be a URL (a string).", param=sub)
        found.append((sub, value))
    return found


def url_values(body: dict[str, Any]) -> list[tuple[str, str]]:
    """(param path, URL) of every URL the engine fetches for this body: the media parts of every
    message's content array."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    found: list[tuple[str, str]] = []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if isinstance(part, dict):
                found.extend(_part_urls(part, f"messages.{i}.content.{j}"))
    return found


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
        if url[:5].lower() == "data:":
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
