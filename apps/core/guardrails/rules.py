"""One compiled detection rule: a pattern on its engine, the pattern of its prefixes, how far it may hold
streamed text back, and the check a candidate must pass (an SSN's ranges, a phone number's validity).

Built-in detectors run on Python's `re` (their patterns are ours: bounded, no nested ambiguity, with
lookarounds for their boundaries); admin patterns run on RE2 (`google-re2`: linear time whatever the
pattern, so no pattern an admin saves can make a request backtrack for seconds). Both are written in the
subset of `apps.core.guardrails.syntax` and go through the same forms.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import re2

from apps.core.guardrails.forms import behind, prefixes, reach, source
from apps.core.guardrails.syntax import Node, PatternError, parse

VALUE_GROUP = "v"  # a built-in pattern's part that is replaced (the rest is context, e.g. "DOB: ")


class Match(Protocol):
    def span(self, group: int = 0, /) -> tuple[int, int]: ...

    def start(self, group: int = 0, /) -> int: ...


class Compiled(Protocol):
    def finditer(self, text: str, pos: int, /) -> Iterator[Match]: ...

    def search(self, text: str, pos: int, /) -> Match | None: ...


class Re2Pattern:
    """An RE2 pattern with `re`'s calls. Text that is not valid Unicode (a lone surrogate from a
    `\\ud800` escape) is searched with U+FFFD in its place: same positions, and RE2 needs UTF-8."""

    def __init__(self, pattern: str) -> None:
        options = re2.Options()
        options.log_errors = False  # the refusal is raised, not written to stderr
        try:
            self._compiled = re2.compile(pattern, options)
        except re2.error as exc:
            reason = exc.args[0] if exc.args else ""
            reason = reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason)
            raise PatternError(f"RE2 refused the pattern: {reason}") from None

    def finditer(self, text: str, pos: int, /) -> Iterator[Match]:
        matches: Iterator[Match] = self._compiled.finditer(_encodable(text), pos)
        return matches

    def search(self, text: str, pos: int, /) -> Match | None:
        found: Match | None = self._compiled.search(_encodable(text), pos)
        return found


_SURROGATE = re.compile("[\ud800-\udfff]")


def _encodable(text: str) -> str:
    if text.isascii():
        return text
    return _SURROGATE.sub("\ufffd", text)


def _always(_: str) -> bool:
    return True


@dataclass(frozen=True)
class Candidate:
    """One match of a rule: its span, the span replaced (`value`), and whether it passed the check."""

    start: int
    end: int
    value_start: int
    value_end: int
    valid: bool


@dataclass(frozen=True)
class Rule:
    pattern: Compiled
    prefix: Compiled  # the prefixes of what `pattern` reads, anchored at the end of the text
    reach: int  # the longest text `prefix` matches: the most this rule holds back
    behind: int  # the most characters before a match that the pattern reads
    valid: Callable[[str], bool] = _always  # on the value's text
    value_group: int | None = None  # the group replaced (None: the whole match)

    def candidates(self, text: str, pos: int) -> Iterator[Candidate]:
        for found in self.pattern.finditer(text, pos):
            start, end = found.span()
            value_start, value_end = (
                found.span(self.value_group) if self.value_group is not None else (start, end)
            )
            yield Candidate(start, end, value_start, value_end, self.valid(text[value_start:value_end]))

    def viable_from(self, text: str, pos: int) -> int:
        """The earliest position at or after `pos` from which the rest of `text` could still be read
        by this rule as more text arrives (`len(text)`: none); text before it is decided."""
        found = self.prefix.search(text, max(pos, len(text) - self.reach))
        return found.start() if found is not None else len(text)


def bounded_reach(tree: Node) -> int:
    hold = reach(tree)
    if hold is None:
        raise PatternError("the pattern can match text of any length: bound every repetition")
    return hold


def python_rule(pattern: str, valid: Callable[[str], bool] = _always) -> Rule:
    """A built-in rule on Python's `re` (lookarounds allowed; the value is group `v` if it has one)."""
    tree = parse(pattern, lookarounds=True)
    compiled = re.compile(source(tree))
    return Rule(
        pattern=compiled,
        prefix=re.compile(f"(?:{prefixes(tree)})\\Z"),
        reach=bounded_reach(tree),
        behind=behind(tree),
        valid=valid,
        value_group=compiled.groupindex.get(VALUE_GROUP),
    )


def re2_rule(tree: Node) -> Rule:
    """An admin rule on RE2 (the whole match is the value)."""
    return Rule(
        pattern=Re2Pattern(source(tree)),
        prefix=Re2Pattern(f"(?:{prefixes(tree)})\\z"),
        reach=bounded_reach(tree),
        behind=behind(tree),
    )
