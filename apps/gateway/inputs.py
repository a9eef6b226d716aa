"""The gateway's one parser for ids in paths, query strings and forms, and its one check for free text.

Ids are ASCII digits only: `str.isdigit()` and `int()` also accept other scripts' digits (Arabic-Indic,
fullwidth, mathematical bold ones: `int` reads each as 1) and `isdigit` even superscripts and circled
numbers (on which `int` then raises). Every route that takes an id calls `parse_id`, so a superscript
two is a 404 like any id that names nothing, never a 500, and an Arabic-Indic one never reaches key 1.

Free text the stores keep (a key's name, a credit's reason, a node id) must be valid Unicode
without control characters: PostgreSQL refuses NUL in `text` (a 500 before), and the others
(newlines, escape sequences) have no business in a name and can forge lines in logs and CSV.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from apps.core.errors import InvalidRequest

MAX_ID = 2**63 - 1  # BIGINT, the widest id column
_ASCII_ID = re.compile(r"[0-9]{1,19}")
# C0 controls, DEL and C1 controls; surrogates are caught by the encode below.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def shown(raw: str, limit: int = 40) -> str:
    """`raw` cut to `limit` characters and escaped to printable ASCII, for an error message."""
    return raw[:limit].encode("unicode_escape").decode("ascii")


def parse_id(raw: object) -> int | None:
    """A positive id written in ASCII digits (at most BIGINT), else None."""
    if not isinstance(raw, str) or not _ASCII_ID.fullmatch(raw):
        return None
    value = int(raw)
    return value if 0 < value <= MAX_ID else None


def text_problem(value: str) -> str | None:
    """Why `value` cannot be stored as a name or reason (None: it can)."""
    if _CONTROL.search(value):
        return "control characters (such as NUL or a newline)"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "invalid Unicode (a lone surrogate)"
    return None


def checked_text(value: str, param: str) -> str:
    """`value`, or a 400 naming `param` when it holds a control character or invalid Unicode."""
    problem = text_problem(value)
    if problem is not None:
        raise InvalidRequest(f"'{param}' must not contain {problem}.", param=param)
    return value


def only_params(params: Mapping[str, str] | Iterable[str], allowed: Iterable[str]) -> None:
    """A 400 for a query parameter the route does not take (`team[]=2` is not `team=2`: ignoring it
    would widen the answer to every team)."""
    known = frozenset(allowed)
    for name in params:
        if name not in known:
            raise InvalidRequest(
                f"Unknown query parameter '{shown(name)}'; expected one of: {', '.join(sorted(known)) or 'none'}.",
                param=shown(name),
            )
