"""Just enough PromQL to evaluate the queries the ScaledObjects carry, over the simulator's scrapes.

Grammar (what `infra/manifests/keda.py` renders): `sum(selector)` (matchers `=`, `!=`, `=~`, `!~`), `vector(n)`, `a or b`, `a + b`,
`a - n`, `clamp_min(x, n)`, parentheses, numbers, and the subquery `max_over_time(expr[2m:15s])`.
An instant vector is one value or `None` (empty): every query aggregates to one series anyway.
A subquery evaluates `expr` at the absolute multiples of its step in `(t - range, t]`, as
Prometheus does; an instant selector reads the latest scrape at or before `t`.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from apps.core.errors import SpecError

Labels = tuple[tuple[str, str], ...]
Value = float | None
_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d+)?)|(?P<dur>\[\d+[smh]:\d+[smh]\])|(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)"
    r"|(?P<sel>\{[^}]*\})|(?P<op>[()+\-,]))"
)
_UNIT = {"s": 1, "m": 60, "h": 3600}


@dataclass
class Samples:
    """Scrapes: times and, per time, every series' value (name, labels) -> value."""

    times: list[float] = field(default_factory=list)
    frames: list[dict[str, list[tuple[Labels, float]]]] = field(default_factory=list)

    def add(self, t: float, series: dict[str, list[tuple[Labels, float]]]) -> None:
        self.times.append(t)
        self.frames.append(series)

    def frame_at(self, t: float) -> int:
        return bisect.bisect_right(self.times, t + 1e-9) - 1


Expr = Callable[[Samples, float], Value]


def _seconds(text: str) -> float:
    return float(text[:-1]) * _UNIT[text[-1]]


class _Parser:
    def __init__(self, query: str) -> None:
        self.query = query
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        while pos < len(query):
            m = _TOKEN.match(query, pos)
            if m is None or m.end() == pos:
                if query[pos:].strip() == "":
                    break
                raise SpecError(
                    f"unsupported PromQL at {query[pos : pos + 20]!r} in {query!r}", param="query"
                )
            kind = m.lastgroup or ""
            self.tokens.append((kind, m.group(kind)))
            pos = m.end()
        self.i = 0

    def peek(self) -> tuple[str, str]:
        return self.tokens[self.i] if self.i < len(self.tokens) else ("end", "")

    def take(self, value: str | None = None) -> tuple[str, str]:
        tok = self.peek()
        if value is not None and tok[1] != value:
            raise SpecError(f"expected {value!r}, got {tok[1]!r} in {self.query!r}", param="query")
        self.i += 1
        return tok

    def expr(self) -> Expr:
        left = self.sum_expr()
        while self.peek() == ("name", "or"):
            self.take()
            right = self.sum_expr()
            left = _or(left, right)
        return left

    def sum_expr(self) -> Expr:
        left = self.atom()
        while self.peek()[1] in ("+", "-"):
            op = self.take()[1]
            left = _arith(left, self.atom(), op)
        return left

    def atom(self) -> Expr:
        kind, text = self.take()
        if kind == "num":
            value = float(text)
            return lambda s, t: value
        if text == "(":
            inner = self.expr()
            self.take(")")
            return inner
        if kind != "name":
            raise SpecError(f"unexpected {text!r} in {self.query!r}", param="query")
        if self.peek()[1] != "(":
            labels = self.take()[1] if self.peek()[0] == "sel" else "{}"
            raise SpecError(
                f"a bare selector {text}{labels} may return many series; wrap it in sum()", param="query"
            )
        self.take("(")
        return self.call(text)

    def call(self, fn: str) -> Expr:
        if fn == "sum":
            name = self.take()[1]
            labels = _labels(self.take()[1]) if self.peek()[0] == "sel" else ()
            self.take(")")
            return _selector_sum(name, labels)
        if fn == "vector":
            value = float(self.take()[1])
            self.take(")")
            return lambda s, t: value
        if fn == "clamp_min":
            inner = self.expr()
            self.take(",")
            floor = float(self.take()[1])
            self.take(")")
            return lambda s, t: None if (v := inner(s, t)) is None else max(v, floor)
        if fn == "max_over_time":
            inner = self.expr()
            kind, text = self.take()
            if kind != "dur":
                raise SpecError(
                    f"max_over_time needs a subquery [range:step] in {self.query!r}", param="query"
                )
            self.take(")")
            rng, step = (_seconds(x) for x in text[1:-1].split(":"))
            return _max_over_time(inner, rng, step)
        raise SpecError(f"unsupported PromQL function {fn!r} in {self.query!r}", param="query")


_MATCHER = re.compile(r'\s*(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
Matcher = tuple[str, str, str]  # label, operator (=, !=, =~, !~), value


def _labels(text: str) -> tuple[Matcher, ...]:
    """The matchers of `{...}`; every one of PromQL's four operators (a regex is anchored, as in
    Prometheus). Anything else is refused: a matcher skipped would sum series the query excludes
    (the canary's pods, `infra/manifests/keda.py` `pod_matcher`)."""
    inner, pos, found = text[1:-1].strip(), 0, []
    while pos < len(inner):
        m = _MATCHER.match(inner, pos)
        if m is None:
            raise SpecError(f"unsupported label matcher in {text!r}", param="query")
        found.append((m.group(1), m.group(2), m.group(3).replace('\\"', '"')))
        pos = m.end()
    return tuple(found)


def _matches(labels: Labels, matchers: tuple[Matcher, ...]) -> bool:
    have = dict(labels)
    for name, op, value in matchers:
        got = have.get(name, "")
        hit = got == value if op in ("=", "!=") else re.fullmatch(value, got) is not None
        if hit != (op in ("=", "=~")):
            return False
    return True


def _or(a: Expr, b: Expr) -> Expr:
    return lambda s, t: v if (v := a(s, t)) is not None else b(s, t)


def _arith(a: Expr, b: Expr, op: str) -> Expr:
    sign = 1.0 if op == "+" else -1.0

    def run(s: Samples, t: float) -> Value:
        x, y = a(s, t), b(s, t)
        return None if x is None or y is None else x + sign * y

    return run


def _selector_sum(name: str, labels: tuple[Matcher, ...]) -> Expr:
    cache: dict[int, Value] = {}

    def run(s: Samples, t: float) -> Value:
        i = s.frame_at(t)
        if i < 0:
            return None
        if i not in cache:
            rows = [v for lab, v in s.frames[i].get(name, ()) if _matches(lab, labels)]
            cache[i] = sum(rows) if rows else None
        return cache[i]

    return run


def _max_over_time(inner: Expr, rng: float, step: float) -> Expr:
    def run(s: Samples, t: float) -> Value:
        k = int(t // step)
        first = int((t - rng) // step) + 1
        values = [v for j in range(first, k + 1) if (v := inner(s, j * step)) is not None]
        return max(values) if values else None

    return run


def compile_query(query: str) -> Expr:
    parser = _Parser(query)
    out = parser.expr()
    if parser.peek()[0] != "end":
        raise SpecError(f"trailing {parser.peek()[1]!r} in {query!r}", param="query")
    return out
