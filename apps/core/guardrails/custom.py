"""A team's own patterns (member ids, medical record numbers): checked when a policy is saved, then run on
RE2. The bounds keep every pattern cheap and every streamed answer's hold-back short: at most
`MAX_PATTERNS` patterns of at most `MAX_PATTERN_CHARS` characters, each matching 1 to `MAX_MATCH_CHARS`
characters (a repetition without a bound, `+` or `*`, is refused: write `{1,12}`)."""

from __future__ import annotations

from apps.core.guardrails.detectors import Detector
from apps.core.guardrails.forms import width
from apps.core.guardrails.rules import re2_rule
from apps.core.guardrails.syntax import Node, PatternError, parse

MAX_PATTERNS = 20
MAX_PATTERN_CHARS = 256
MAX_MATCH_CHARS = 64


def checked_tree(pattern: str) -> Node:
    """The parsed pattern, or `PatternError` saying what to change."""
    if not pattern:
        raise PatternError("the pattern is empty")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise PatternError(f"the pattern is {len(pattern)} characters long; at most {MAX_PATTERN_CHARS}")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in pattern):
        raise PatternError("write control characters as escapes (\\n, \\t, \\xHH), not as themselves")
    tree = parse(pattern)
    low, high = width(tree)
    if low == 0:
        raise PatternError("the pattern can match empty text; it must match at least one character")
    if high is None or high > MAX_MATCH_CHARS:
        raise PatternError(
            f"the pattern can match more than {MAX_MATCH_CHARS} characters: bound every repetition "
            "(e.g. [0-9]{6,12} rather than [0-9]+)"
        )
    return tree


def custom_detector(name: str, pattern: str) -> Detector:
    """The detector of a checked pattern, compiled for RE2 (`PatternError` if RE2 refuses it)."""
    return Detector(name, (re2_rule(checked_tree(pattern)),))
