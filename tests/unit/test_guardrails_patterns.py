"""Admin patterns: the subset they are written in (what is refused, with a message saying why), their
bounds, RE2 (a pattern that would backtrack for hours on Python's `re` runs in linear time), and the
prefix patterns the streaming scanner holds text back by (exact, checked by brute force)."""

from __future__ import annotations

import itertools
import re

import pytest

from apps.core.guardrails.custom import MAX_MATCH_CHARS, MAX_PATTERN_CHARS, checked_tree, custom_detector
from apps.core.guardrails.forms import prefixes, reach, source, width
from apps.core.guardrails.rules import Re2Pattern
from apps.core.guardrails.syntax import PatternError, parse

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("pattern", "expected_source", "expected_width"),
    [
        (r"M[0-9]{9}", "M(?:[0-9]){9}", (10, 10)),
        (r"(?i)mrn-?[0-9]{6,8}", "(?i:mrn(?:-)?(?:[0-9]){6,8})", (9, 12)),
        (r"\bMB[A-Z]{2}\d{6}\b", r"\bMB(?:[A-Z]){2}(?:\d){6}\b", (10, 10)),
        (r"(?:AB|CD)\.[0-9]{4}", r"(?:(?:AB|CD))\.(?:[0-9]){4}", (7, 7)),
        (r"[\]\-a-c.]x", r"[\]\-a-c.]x", (2, 2)),
        (r"(?P<id>H[0-9]{3})\x2Dz", r"(?P<id>H(?:[0-9]){3})-z", (6, 6)),
        (r"a}]", r"a\}\]", (3, 3)),
    ],
)
def test_accepted_patterns_and_their_canonical_form(
    pattern: str, expected_source: str, expected_width: tuple[int, int]
) -> None:
    tree = checked_tree(pattern)
    assert source(tree) == expected_source
    assert width(tree) == expected_width
    assert re.compile(source(tree))  # Python's `re` reads it too
    assert Re2Pattern(source(tree))


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        (r"(a)\1", "backreferences"),
        (r"(?=x)y", "lookarounds are not supported"),
        (r"(?<!x)y", "lookarounds are not supported"),
        (r"a{1,3}?", "lazy, possessive"),
        (r"a{1,3}+", "lazy, possessive"),
        (r"[[:alpha:]]", "no nested or POSIX sets"),
        (r"\p{L}", "unsupported escape"),
        (r"a{2,1}", "m <= n"),
        (r"a{1001}", "at most 1000"),
        (r"(?m)x", "unsupported group"),
        (r"x{", "escape a literal brace"),
        (r"[]a]", "cannot start with ']'"),
        (r"[z-a]", "first character before its last"),
        (r"M[0-9]+", "more than 64 characters"),
        (r"[A-Z]{65}", "more than 64 characters"),
        (r"a?", "can match empty text"),
        (r"\b", "can match empty text"),
        ("", "empty"),
        ("a" * (MAX_PATTERN_CHARS + 1), "at most 256"),
        ("(ab", "missing ')'"),
        ("ab)", "unbalanced"),
        ("*a", "nothing to repeat"),
        ("a\\", "end with a backslash"),
        ("a\nb", "control characters"),
        ("(" * 40 + "a" + ")" * 40, "nest at most"),
    ],
)
def test_refused_patterns_say_why(pattern: str, why: str) -> None:
    with pytest.raises(PatternError, match=re.escape(why)):
        custom_detector("p", pattern)


def test_the_bounds_are_the_documented_ones() -> None:
    assert (MAX_PATTERN_CHARS, MAX_MATCH_CHARS) == (256, 64)
    assert width(checked_tree("[A-Z]{64}")) == (64, 64)


def test_a_pattern_that_backtracks_forever_on_re_runs_on_re2_in_linear_time() -> None:
    # Nested bounded repetitions: Python's `re` tries every split of the run at every start (7^9 ways),
    # RE2 reads the text once. The test's timeout is the bound that would fail on a backtracking engine.
    detector = custom_detector("evil", r"(?:a{1,7}){1,9}b")
    (rule,) = detector.rules
    text = "a" * 50_000 + "c"
    assert isinstance(rule.pattern, Re2Pattern)
    assert list(rule.candidates(text, 0)) == []
    assert [c.start for c in rule.candidates("xaaab", 0)] == [1]


def test_re2_searches_from_a_position_with_the_text_before_it_as_context() -> None:
    # The streaming scanner searches a window from where the released text ends: `\b` and `^` must see
    # the characters before that position, as a search of the whole text would.
    compiled = Re2Pattern(r"\bM[0-9]{2}")
    assert compiled.search("xM12", 1) is None
    found = compiled.search("x M12", 2)
    assert found is not None
    assert found.span() == (2, 5)
    assert Re2Pattern("^M").search("aM", 1) is None


def test_re2_reads_text_with_a_lone_surrogate() -> None:
    compiled = Re2Pattern("M[0-9]{2}")
    found = compiled.search("\ud800 M12", 0)
    assert found is not None
    assert found.span() == (2, 5)


def _prefixes_by_brute_force(pattern: str, alphabet: str, longest: int) -> set[str]:
    """Every prefix of every string over `alphabet` that `pattern` matches whole."""
    matcher = re.compile(pattern)
    found: set[str] = set()
    for n in range(longest + 1):
        for chars in itertools.product(alphabet, repeat=n):
            text = "".join(chars)
            if matcher.fullmatch(text):
                found.update(text[:i] for i in range(len(text) + 1))
    return found


@pytest.mark.parametrize(
    ("pattern", "alphabet"),
    [
        (r"ab{1,3}c", "abcx"),
        (r"(?:ab|a)c?d", "abcdx"),
        (r"[ab]{2}(?:c|dd)", "abcdx"),
        (r"(?i)a(?:b|c){0,2}d", "aAbcDx"),
        (r"x(?:yz){1,2}", "xyza"),
    ],
)
def test_prefix_patterns_match_exactly_the_prefixes_of_matches(pattern: str, alphabet: str) -> None:
    tree = parse(pattern)
    longest = width(tree)[1]
    assert longest is not None
    expected = _prefixes_by_brute_force(source(tree), alphabet, longest)
    prefix = re.compile(f"(?:{prefixes(tree)})")
    for n in range(longest + 1):
        for chars in itertools.product(alphabet, repeat=n):
            text = "".join(chars)
            assert bool(prefix.fullmatch(text)) == (text in expected), (pattern, text)
    assert reach(tree) == longest


def test_a_lookahead_is_held_for_as_far_as_it_reads() -> None:
    tree = parse(r"(?P<v>[0-9]{3})(?![0-9]|\.[0-9])", lookarounds=True)
    prefix = re.compile(f"(?:{prefixes(tree)})")
    assert prefix.fullmatch("123.")  # "123.4" would be no match: "123." is not decided yet
    assert not prefix.fullmatch("123 ")
    assert reach(tree) == 5
