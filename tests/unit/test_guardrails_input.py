"""`scan_input`: the texts of a chat, completion or embeddings body, redacted into a new body (the
original unchanged), each decision naming its field, and the first block refusing the request."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from apps.core.errors import http_error
from apps.core.guardrails.bodies import scan_input
from apps.core.guardrails.decisions import GuardrailBlocked
from apps.core.guardrails.policy import Check, compile_policy, parse_policy

pytestmark = pytest.mark.timeout(30)

SSN = "SSN 123-45-6789"


def checks(**actions: str) -> tuple[Check, ...]:
    document = {"input": [{"detector": name, "action": action} for name, action in actions.items()]}
    return compile_policy(parse_policy(document)).input


def test_chat_strings_and_text_parts_are_redacted_in_a_new_body() -> None:
    body: dict[str, Any] = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "You are kind. Mail ops@example.org."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": SSN},
                    {"type": "image_url", "image_url": {"url": "https://example.org/a@b.com.png"}},
                    "bare part, call (650) 253-0000",
                    {"type": "input_text", "text": "none here"},
                ],
            },
            {"role": "assistant", "content": None, "tool_calls": [{"id": "t"}]},
        ],
    }
    original = copy.deepcopy(body)
    scan = scan_input(checks(ssn="redact", email="redact", phone="flag"), "chat", body)
    assert body == original
    assert scan.blocked is None
    assert scan.body["model"] == "m"
    assert scan.body["messages"][0]["content"] == "You are kind. Mail [REDACTED:EMAIL]."
    parts = scan.body["messages"][1]["content"]
    assert parts[0] == {"type": "text", "text": "SSN [REDACTED:SSN]"}
    assert parts[1] == original["messages"][1]["content"][1]  # media parts are not text
    assert parts[2] == "bare part, call (650) 253-0000"  # flagged only
    assert scan.body["messages"][2] == original["messages"][2]
    assert [(d.check, d.action, d.field) for d in scan.decisions] == [
        ("email", "redact", "messages.0.content"),
        ("ssn", "redact", "messages.1.content.0.text"),
        ("phone", "flag", "messages.1.content.2"),
    ]


@pytest.mark.parametrize(
    ("prompt", "expected", "field"),
    [
        (SSN, "SSN [REDACTED:SSN]", "prompt"),
        ([SSN], ["SSN [REDACTED:SSN]"], "prompt.0"),
        ([1, 2, 3], [1, 2, 3], None),  # token ids: no text to scan
        ([SSN, SSN], [SSN, SSN], None),  # several prompts are refused by validation, not scanned here
    ],
)
def test_a_completion_prompt(prompt: Any, expected: Any, field: str | None) -> None:
    scan = scan_input(checks(ssn="redact"), "completions", {"model": "m", "prompt": prompt})
    assert scan.body["prompt"] == expected
    assert [d.field for d in scan.decisions] == ([field] if field else [])


def test_embeddings_inputs() -> None:
    body = {"model": "e", "input": ["fine", "mail a@example.com", [5, 6]]}
    scan = scan_input(checks(email="redact"), "embeddings", body)
    assert scan.body["input"] == ["fine", "mail [REDACTED:EMAIL]", [5, 6]]
    assert [d.field for d in scan.decisions] == ["input.1"]
    single = scan_input(checks(email="redact"), "embeddings", {"model": "e", "input": "a@example.com"})
    assert single.body["input"] == "[REDACTED:EMAIL]"


def test_the_first_block_refuses_the_request_with_its_field_and_no_content() -> None:
    body = {
        "messages": [
            {"role": "user", "content": "mail a@example.com"},
            {"role": "user", "content": "my SSN is 123-45-6789"},
            {"role": "user", "content": "and 234-56-7890"},
        ]
    }
    scan = scan_input(checks(email="redact", ssn="block"), "chat", body)
    assert scan.blocked is not None
    assert (scan.blocked.check, scan.blocked.field) == ("ssn", "messages.1.content")
    assert [d.action for d in scan.decisions] == ["redact", "block"]  # nothing scanned after the block
    status, _, envelope = http_error(GuardrailBlocked(scan.blocked))
    assert status == 400
    error = envelope["error"]
    assert isinstance(error, dict)
    assert (error["code"], error["param"]) == ("guardrail_blocked", "messages.1.content")
    assert "123-45-6789" not in str(envelope)
    assert "ssn" in error["message"]


def test_no_checks_change_nothing() -> None:
    body = {"messages": [{"role": "user", "content": SSN}]}
    scan = scan_input((), "chat", body)
    assert scan.body == body
    assert scan.decisions == ()
    assert scan.blocked is None
