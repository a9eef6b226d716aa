"""The built-in detectors as one table: what each redacts, and the near misses it must leave alone
(the SSA's never-issued SSN ranges, nine digits without an SSN keyword, version numbers, NPIs, dates
without a birth keyword, `@` in code)."""

from __future__ import annotations

import pytest

from apps.core.guardrails.detectors import BUILTIN, date_of
from apps.core.guardrails.policy import compile_policy, parse_policy
from apps.core.guardrails.scan import scan_text

pytestmark = pytest.mark.timeout(60)


def redacted(detector: str, text: str) -> str:
    checks = compile_policy(parse_policy({"output": [{"detector": detector, "action": "redact"}]})).output
    return scan_text(checks, text, direction="output", field="t").text


POSITIVES = [
    ("ssn", "SSN 123-45-6789", "SSN [REDACTED:SSN]"),
    ("ssn", "my ssn is 123-45-6789.", "my ssn is [REDACTED:SSN]."),
    ("ssn", "(on file: 078-05-1120)", "(on file: [REDACTED:SSN])"),
    ("ssn", "Social Security Number: 899-99-9998", "Social Security Number: [REDACTED:SSN]"),
    ("ssn", "SSN: 123456789", "SSN: [REDACTED:SSN]"),
    ("ssn", "ssn#234 56 7890 on record", "ssn#[REDACTED:SSN] on record"),
    ("ssn", "social security no. 665-01-0001", "social security no. [REDACTED:SSN]"),
    ("ssn", "a 123-45-6789 and b 234-56-7890", "a [REDACTED:SSN] and b [REDACTED:SSN]"),
    ("phone", "call (650) 253-0000 today", "call [REDACTED:PHONE] today"),
    ("phone", "650-253-0000", "[REDACTED:PHONE]"),
    ("phone", "at 650.253.0000.", "at [REDACTED:PHONE]."),
    ("phone", "tel 650 253 0000", "tel [REDACTED:PHONE]"),
    ("phone", "+1 650 253 0000", "[REDACTED:PHONE]"),
    ("phone", "+1-650-253-0000", "[REDACTED:PHONE]"),
    ("phone", "1-800-275-2273", "[REDACTED:PHONE]"),
    ("phone", "E.164: +16502530000", "E.164: [REDACTED:PHONE]"),
    ("phone", "(650)253-0000", "[REDACTED:PHONE]"),
    ("email", "mail jane.doe@example.com now", "mail [REDACTED:EMAIL] now"),
    ("email", "<john+tag@sub.example.co.uk>", "<[REDACTED:EMAIL]>"),
    ("email", "mailto:a_b@health-plan.org.", "mailto:[REDACTED:EMAIL]."),
    ("email", "JOHN.SMITH@EXAMPLE.HEALTH", "[REDACTED:EMAIL]"),
    ("dob", "DOB: 03/04/1980", "DOB: [REDACTED:DOB]"),
    ("dob", "dob 3/4/80", "dob [REDACTED:DOB]"),
    ("dob", "Date of birth - 1980-03-04", "Date of birth - [REDACTED:DOB]"),
    ("dob", "He was born on March 3, 1980.", "He was born on [REDACTED:DOB]."),
    ("dob", "Birthdate: 3rd of March 1980", "Birthdate: [REDACTED:DOB]"),
    ("dob", "D.O.B. 12.31.1999", "D.O.B. [REDACTED:DOB]"),
    ("dob", "born 29 Feb 2000", "born [REDACTED:DOB]"),
    ("dob", "birthday is Sept. 9, 1961", "birthday is [REDACTED:DOB]"),
]

NEGATIVES = [
    ("ssn", "000-12-3456"),  # area 000
    ("ssn", "666-12-3456"),  # area 666
    ("ssn", "900-12-3456"),  # areas 900-999
    ("ssn", "SSN: 999-99-9999"),
    ("ssn", "123-00-4567"),  # group 00
    ("ssn", "123-45-0000"),  # serial 0000
    ("ssn", "claim 123456789"),  # nine digits, no SSN keyword
    ("ssn", "rows 123 45 6789"),  # spaced, no keyword
    ("ssn", "1123-45-6789"),
    ("ssn", "123-45-67890"),
    ("ssn", "ISBN 123-45-6789-X"),
    ("ssn", "SSN: 12345678"),
    ("ssn", "version 10.2.3"),
    ("ssn", "call 650-253-0000"),
    ("phone", "NPI 6502530000"),  # ten bare digits: NPIs, order numbers
    ("phone", "123-456-7890"),  # an area code cannot start with 1
    ("phone", "650-153-0000"),  # nor an exchange
    ("phone", "911-253-0000"),  # N11 is no area code
    ("phone", "dial 253-0000"),  # no area code
    ("phone", "650-253-00001"),
    ("phone", "host 10.650.253.0000"),
    ("phone", "on 2024-01-15"),
    ("phone", "build 650.253.000"),
    ("email", "@decorator"),
    ("email", "user@localhost"),
    ("email", "icon@2x.png"),
    ("email", "a@b.c"),
    ("email", "name@domain"),
    ("email", "y = weights@inputs.transpose()"),
    ("email", "x = a @ b"),
    ("email", "m = grid@rows.cells[0]"),
    ("email", "john..doe@example.com"),
    ("dob", "03/04/1980"),  # a date, no birth keyword
    ("dob", "Appointment on March 3, 1980"),
    ("dob", "DOB: 02/30/1980"),  # no such day
    ("dob", "DOB: 13/01/1980"),
    ("dob", "DOB: 29 Feb 2001"),  # not a leap year
    ("dob", "born in 1980"),
    ("dob", "DOB: unknown"),
    ("dob", "dobson 03/04/1980"),
    ("dob", "DOB 1/2/3"),
    ("dob", "DOB: 03/04/1780"),
]


@pytest.mark.parametrize(("detector", "text", "expected"), POSITIVES)
def test_a_detector_redacts_what_it_names(detector: str, text: str, expected: str) -> None:
    assert redacted(detector, text) == expected


@pytest.mark.parametrize(("detector", "text"), NEGATIVES)
def test_a_near_miss_is_left_alone(detector: str, text: str) -> None:
    assert redacted(detector, text) == text


def test_every_detector_has_positives_and_negatives() -> None:
    assert {d for d, _, _ in POSITIVES} == set(BUILTIN) == {d for d, _ in NEGATIVES}


def test_every_detector_at_once_and_the_labels() -> None:
    policy = parse_policy(
        {
            "output": [{"detector": name, "action": "redact"} for name in BUILTIN]
            + [{"detector": "member_id", "action": "redact"}],
            "patterns": [{"name": "member_id", "pattern": r"\bM[0-9]{9}\b"}],
        }
    )
    text = (
        "Member M123456789, SSN 123-45-6789, DOB: 1980-03-04, phone (650) 253-0000, "
        "mail a.b@example.org; not M12345678."
    )
    outcome = scan_text(compile_policy(policy).output, text, direction="output", field="t")
    assert outcome.text == (
        "Member [REDACTED:MEMBER_ID], SSN [REDACTED:SSN], DOB: [REDACTED:DOB], phone [REDACTED:PHONE], "
        "mail [REDACTED:EMAIL]; not M12345678."
    )
    assert [d.check for d in outcome.decisions] == ["member_id", "ssn", "dob", "phone", "email"]


def test_an_ssn_seen_by_two_rules_is_one_decision() -> None:
    checks = compile_policy(parse_policy({"input": [{"detector": "ssn", "action": "flag"}]})).input
    outcome = scan_text(checks, "SSN: 123-45-6789", direction="input", field="prompt")
    assert outcome.text == "SSN: 123-45-6789"  # flagged, not changed
    assert [(d.check, d.action, d.field) for d in outcome.decisions] == [("ssn", "flag", "prompt")]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("3/4/80", (2080, 3, 4)),
        ("1980-03-04", (1980, 3, 4)),
        ("3rd of March, 1980", (1980, 3, 3)),
        ("2/30/1980", None),
    ],
)
def test_the_date_a_birth_date_names(value: str, expected: tuple[int, int, int] | None) -> None:
    found = date_of(value)
    assert (None if found is None else (found.year, found.month, found.day)) == expected
