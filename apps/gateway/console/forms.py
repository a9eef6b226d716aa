"""Parsing the console's query strings and forms into typed values, or a `Problem` for the page."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from urllib.parse import parse_qs

from starlette.requests import Request

from apps.gateway.inputs import parse_id, text_problem

MAX_FORM_BYTES = 64 * 1024
MAX_RANGE_DAYS = 366
DEFAULT_RANGE_DAYS = 30
# The days a form may name: the API's range (`apps.gateway.usage`), so a range's first day and its
# exclusive end (a year either way) stay within what `date` and PostgreSQL hold.
MIN_DAY = date(1970, 1, 1)
MAX_DAY = date(9998, 12, 31)
# The key limits' columns (INTEGER, and BIGINT for tokens_per_day): a larger value is a message.
FIELD_MAX = {"tokens_per_day": 2**63 - 1}
INT_MAX = 2**31 - 1


class Problem(Exception):
    """Bad input: shown as a message on the page (status 400); nothing was changed."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


async def read_form(request: Request) -> dict[str, list[str]]:
    """An `application/x-www-form-urlencoded` body (the console's forms send nothing else)."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise Problem("The form is too large.", 413)
    return parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True)


def first(form: Mapping[str, list[str]], name: str) -> str:
    values = form.get(name) or [""]
    return values[0].strip()


@dataclass(frozen=True)
class UsageQuery:
    start: date  # inclusive
    end: date  # inclusive (the page's "to" day)
    model: str | None

    @property
    def end_exclusive(self) -> date:
        return self.end + timedelta(days=1)

    def days(self) -> list[date]:
        return [self.start + timedelta(days=i) for i in range((self.end - self.start).days + 1)]


def _day(raw: str, name: str) -> date:
    try:
        day = date.fromisoformat(raw)
    except ValueError:
        raise Problem(f"'{name}' must be a date like 2026-01-31 (got {raw[:40]!r}).") from None
    if not MIN_DAY <= day <= MAX_DAY:
        raise Problem(f"'{name}' must be a date between {MIN_DAY} and {MAX_DAY} (got {raw[:40]!r}).")
    return day


def usage_query(params: Mapping[str, str], models: Collection[str], today: date) -> UsageQuery:
    end = _day(params["to"], "to") if params.get("to") else today
    start = (
        _day(params["from"], "from")
        if params.get("from")
        else max(end - timedelta(days=DEFAULT_RANGE_DAYS - 1), MIN_DAY)
    )
    if start > end:
        raise Problem("The range is empty: 'from' must be on or before 'to'.")
    if (end - start).days + 1 > MAX_RANGE_DAYS:
        raise Problem(f"The range is too long: at most {MAX_RANGE_DAYS} days.")
    model = params.get("model") or None
    if model is not None and model not in models:
        raise Problem(f"Unknown model {model[:80]!r}: pick one of {', '.join(sorted(models))}.")
    return UsageQuery(start, end, model)


def positive_int(form: Mapping[str, list[str]], name: str) -> int | None:
    raw = first(form, name)
    if not raw:
        return None
    value = parse_id(raw)  # ASCII digits only (apps.gateway.inputs)
    maximum = FIELD_MAX.get(name, INT_MAX)
    if value is None or value > maximum:
        raise Problem(f"'{name}' must be a whole number from 1 to {maximum} (or empty for no limit).")
    return value


def clean_text(form: Mapping[str, list[str]], name: str, limit: int = 200) -> str:
    """A form's free-text field (a key's name, a credit's reason), trimmed to `limit`; a message when
    it holds a control character (NUL: PostgreSQL refuses it) or invalid Unicode."""
    value = first(form, name)[:limit]
    problem = text_problem(value)
    if problem is not None:
        raise Problem(f"'{name}' must not contain {problem}.")
    return value


def expiry(form: Mapping[str, list[str]], now: datetime) -> datetime | None:
    raw = first(form, "expires")
    if not raw:
        return None
    at = datetime.combine(_day(raw, "expires"), datetime.min.time(), UTC)
    if at <= now:
        raise Problem("'expires' must be a future date.")
    return at
