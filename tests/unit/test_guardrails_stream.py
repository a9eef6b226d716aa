"""The streaming scanner: ordinary text flows, only a tail that could still become a match is held (never
more than the stated bound), PII split across any chunk boundary is redacted exactly as the whole text
would be (a property test over random texts and random splits), and a block is reported as soon as it is
certain, with nothing after it released."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.core.guardrails.policy import CompiledPolicy, compile_policy, parse_policy
from apps.core.guardrails.scan import MAX_HOLD_CHARS, Outcome, scan_text
from apps.core.guardrails.stream import OutputScanner

pytestmark = pytest.mark.timeout(120)

ALL_REDACT = {
    "output": [
        {"detector": "ssn", "action": "redact"},
        {"detector": "phone", "action": "redact"},
        {"detector": "email", "action": "redact"},
        {"detector": "dob", "action": "flag"},
        {"detector": "member_id", "action": "redact"},
    ],
    "patterns": [{"name": "member_id", "pattern": r"\bM-?[0-9]{6,9}\b"}],
}


NUMBERS_ONLY = {
    "output": [
        {"detector": "ssn", "action": "redact"},
        {"detector": "phone", "action": "redact"},
        {"detector": "dob", "action": "redact"},
    ]
}
CUSTOM_ONLY = {
    "output": [{"detector": "mrn", "action": "redact"}, {"detector": "plan", "action": "flag"}],
    "patterns": [
        {"name": "mrn", "pattern": r"\bM-?[0-9]{6,9}\b"},
        {"name": "plan", "pattern": r"(?i)(?:hello|2024)-?(?:world|[0-9]{2}){1,2}$"},
    ],
}
POLICIES = [ALL_REDACT, NUMBERS_ONLY, CUSTOM_ONLY]


def policy(document: dict[str, object]) -> CompiledPolicy:
    return compile_policy(parse_policy(document))


def stream(scanner: OutputScanner, chunks: list[str]) -> tuple[list[Outcome], Outcome]:
    steps = [scanner.feed(chunk) for chunk in chunks]
    return steps, scanner.finish()


def test_words_flow_and_only_a_trailing_word_waits() -> None:
    scanner = OutputScanner(policy(ALL_REDACT).output)
    assert scanner.feed("Hello").text == ""  # "Hello" may still become "Hello.Kitty@example.com"
    assert scanner.feed(" there, how").text == "Hello there, "
    assert scanner.feed(" are you?").text == "how are you?"
    assert scanner.held == 0
    assert scanner.finish().text == ""


def test_digits_only_checks_release_words_at_once() -> None:
    scanner = OutputScanner(policy({"output": [{"detector": "phone", "action": "redact"}]}).output)
    assert scanner.feed("Call me").text == "Call me"
    assert scanner.feed(" at 650-25").text == " at "
    assert scanner.feed("3-0000 or").text == "[REDACTED:PHONE] or"
    assert scanner.finish().text == ""


def test_an_ssn_split_across_chunks_is_redacted_and_never_released_in_part() -> None:
    scanner = OutputScanner(policy(ALL_REDACT).output)
    steps, end = stream(scanner, ["my SSN is 123-", "45-67", "89", " on file"])
    assert [s.text for s in steps] == ["my ", "", "", "SSN is [REDACTED:SSN] on "]
    assert end.text == "file"
    assert [(d.check, d.action) for d in steps[3].decisions] == [("ssn", "redact")]


def test_a_block_is_reported_once_certain_and_ends_the_answer() -> None:
    checks = policy({"output": [{"detector": "ssn", "action": "block"}]}).output
    scanner = OutputScanner(checks, field="choices.1")
    first = scanner.feed("Sure, it is 123-45-6789")
    assert first.blocked is None
    assert first.text == "Sure, it is "
    second = scanner.feed(". More")
    assert second.blocked is not None
    assert (second.blocked.check, second.blocked.action, second.blocked.field) == (
        "ssn",
        "block",
        "choices.1",
    )
    assert second.text == ""
    after = scanner.feed(" text")
    assert after.text == ""
    assert after.blocked == second.blocked
    assert scanner.finish().blocked == second.blocked


def test_the_hold_back_never_exceeds_its_bound() -> None:
    scanner = OutputScanner(policy(ALL_REDACT).output)
    assert scanner.max_hold <= MAX_HOLD_CHARS
    for chunk in ["a" * 50, "." * 3, "b" * 90, "-", "1" * 40, "@", "c" * 70]:
        scanner.feed(chunk)
        assert scanner.held <= scanner.max_hold


def test_the_longest_address_fed_a_character_at_a_time_is_redacted_whole() -> None:
    address = "a" * 64 + "@" + "b" * 49 + "c.health"  # the longest local part and domain the detector takes
    text = f"write to {address} today"
    scanner = OutputScanner(policy(ALL_REDACT).output)
    released = []
    for char in text:
        released.append(scanner.feed(char).text)
        assert scanner.held <= scanner.max_hold
    released.append(scanner.finish().text)
    assert "".join(released) == "write to [REDACTED:EMAIL] today"
    assert not any("@" in r or "aaa" in r for r in released)  # no piece of it was ever sent


def test_a_policy_without_output_checks_releases_everything() -> None:
    scanner = OutputScanner(())
    assert scanner.feed("SSN 123-45-6789").text == "SSN 123-45-6789"
    assert scanner.held == 0


def test_the_scanner_refuses_text_after_its_end() -> None:
    scanner = OutputScanner(policy(ALL_REDACT).output)
    scanner.finish()
    with pytest.raises(RuntimeError):
        scanner.feed("more")


FRAGMENTS = [
    "SSN 123-45-6789",
    "ssn: 234567890",
    "123-45-6789",
    "666-12-3456",
    "(650) 253-0000",
    "+1 650 253 0000",
    "650.253.0000",
    "jane.doe@example.com",
    "a@b.co",
    "icon@2x.png",
    "DOB: 03/04/1980",
    "born on March 3, 1980",
    "M123456",
    "M-12345678",
    "v1.2.3",
    "2024-01-15",
    "hello",
    "world",
    "1234567890",
    " ",
    ", ",
    ".",
    "-",
    "\n",
    "@",
    "(",
    "5",
    "M",
    "is ",
    "e.com",
]


@st.composite
def split_texts(draw: st.DrawFn) -> tuple[str, list[str]]:
    text = "".join(draw(st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=14)))
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=12)))
    bounds = [0, *cuts, len(text)]
    return text, [text[a:b] for a, b in itertools.pairwise(bounds)]


def _decisions(outcomes: list[Outcome]) -> Counter[tuple[str, str]]:
    return Counter((d.check, d.action) for o in outcomes for d in o.decisions)


def test_a_number_is_held_while_a_lookahead_could_still_undo_it() -> None:
    scanner = OutputScanner(policy({"output": [{"detector": "ssn", "action": "redact"}]}).output)
    assert scanner.feed("ref 123-45-6789.").text == "ref "  # "123-45-6789.5" would be no SSN
    assert scanner.feed("5 ok").text + scanner.finish().text == "123-45-6789.5 ok"


@pytest.mark.parametrize("document", POLICIES, ids=["all", "numbers", "custom"])
@settings(max_examples=300, deadline=None)
@given(case=split_texts())
def test_any_split_releases_the_one_shot_redaction(
    document: dict[str, object], case: tuple[str, list[str]]
) -> None:
    text, chunks = case
    checks = policy(document).output
    whole = scan_text(checks, text, direction="output", field="choices.0")
    scanner = OutputScanner(checks)
    steps, end = stream(scanner, chunks)
    assert "".join(s.text for s in [*steps, end]) == whole.text
    assert _decisions([*steps, end]) == _decisions([whole])


@settings(max_examples=200, deadline=None)
@given(split_texts())
def test_any_split_blocks_exactly_when_the_whole_text_does(case: tuple[str, list[str]]) -> None:
    text, chunks = case
    checks = policy(
        {
            "output": [{"detector": "email", "action": "block"}, {"detector": "ssn", "action": "redact"}],
        }
    ).output
    whole = scan_text(checks, text, direction="output", field="choices.0")
    scanner = OutputScanner(checks)
    steps, end = stream(scanner, chunks)
    blocked = [s.blocked for s in [*steps, end] if s.blocked is not None]
    assert bool(blocked) == (whole.blocked is not None)
    released = "".join(s.text for s in [*steps, end])
    assert whole.text.startswith(released)  # never more than the text before the block
