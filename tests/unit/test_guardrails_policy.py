"""The policy document: the documented example parses, compiles and survives a JSON round trip; every bad
policy is one `InvalidRequest` (400) whose `param` and message name the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from apps.core.errors import InvalidRequest
from apps.core.guardrails.policy import GuardrailPolicy, compile_policy, parse_policy

pytestmark = pytest.mark.timeout(30)

DOC = Path(__file__).resolve().parents[2] / "docs" / "guardrails.md"
EXAMPLE: dict[str, Any] = {
    "input": [
        {"detector": "ssn", "action": "block"},
        {"detector": "email", "action": "redact"},
        {"detector": "member_id", "action": "redact"},
    ],
    "output": [
        {"detector": "ssn", "action": "redact"},
        {"detector": "phone", "action": "redact"},
        {"detector": "dob", "action": "flag"},
        {"detector": "member_id", "action": "redact"},
    ],
    "patterns": [{"name": "member_id", "pattern": "\\bM[0-9]{9}\\b"}],
    "guard_model": {"model": "llama-3.1-8b-instruct", "template": "instruct", "input": True, "output": False},
}


def test_the_documented_example_parses_compiles_and_round_trips() -> None:
    documented = DOC.read_text(encoding="utf-8").split("```json\n", 1)[1].split("```", 1)[0]
    assert json.loads(documented) == EXAMPLE
    policy = parse_policy(EXAMPLE, chat_models=["llama-3.1-8b-instruct"])
    assert parse_policy(json.loads(json.dumps(policy.as_json()))) == policy
    compiled = compile_policy(policy)
    assert [(c.name, c.action) for c in compiled.input] == [
        ("ssn", "block"),
        ("email", "redact"),
        ("member_id", "redact"),
    ]
    assert compiled.output[3].detector.label == "MEMBER_ID"
    assert compiled.guard_model is not None
    assert compiled.guard_model.action == "block"


def test_an_empty_policy_checks_nothing() -> None:
    compiled = compile_policy(parse_policy({}))
    assert compiled.input == ()
    assert compiled.output == ()
    assert compiled.guard_model is None
    assert parse_policy({}) == GuardrailPolicy()


@pytest.mark.parametrize(
    ("document", "param", "says"),
    [
        ([], "policy", "JSON object"),
        ({"inputs": []}, "inputs", "Extra inputs"),
        (
            {"input": [{"detector": "ssn", "action": "erase"}]},
            "input.0.action",
            "'redact', 'block' or 'flag'",
        ),
        ({"input": [{"detector": "ssn"}]}, "input.0.action", "Field required"),
        ({"input": [{"detector": "ssn", "action": "flag", "why": 1}]}, "input.0.why", "Extra inputs"),
        ({"output": [{"detector": "passport", "action": "flag"}]}, "output.0.detector", "unknown detector"),
        ({"output": [{"detector": 3, "action": "flag"}]}, "output.0.detector", "valid string"),
        (
            {"output": [{"detector": "ssn", "action": "flag"}, {"detector": "ssn", "action": "redact"}]},
            "output.1.detector",
            "checked twice",
        ),
        ({"patterns": [{"name": "mrn", "pattern": "(a)\\1"}]}, "patterns.0.pattern", "backreferences"),
        (
            {"patterns": [{"name": "mrn", "pattern": "[0-9]+"}]},
            "patterns.0.pattern",
            "bound every repetition",
        ),
        ({"patterns": [{"name": "ssn", "pattern": "x"}]}, "patterns.0.name", "is taken"),
        ({"patterns": [{"name": "Bad Name", "pattern": "x"}]}, "patterns.0.name", "should match pattern"),
        (
            {"patterns": [{"name": "a", "pattern": "x"}, {"name": "a", "pattern": "y"}]},
            "patterns.1.name",
            "is taken",
        ),
        ({"patterns": [{"name": f"p{i}", "pattern": "x"} for i in range(21)]}, "patterns", "at most 20"),
        ({"guard_model": {"model": "gpt-4"}}, "guard_model.model", "not a chat model"),
        ({"guard_model": {"model": "bge-m3"}}, "guard_model.model", "not a chat model"),
        (
            {"guard_model": {"model": "llama-3.1-8b-instruct", "input": False}},
            "guard_model",
            "checks nothing",
        ),
        (
            {"guard_model": {"model": "llama-3.1-8b-instruct", "input": "yes"}},
            "guard_model.input",
            "valid boolean",
        ),
        (
            {"guard_model": {"model": "llama-3.1-8b-instruct", "action": "redact"}},
            "guard_model.action",
            "'block'",
        ),
    ],
)
def test_a_bad_policy_is_a_400_naming_the_field(document: Any, param: str, says: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_policy(document, chat_models=["llama-3.1-8b-instruct"])
    assert caught.value.status == 400
    assert caught.value.param == param
    assert says in caught.value.message
    assert caught.value.message.startswith(param) or param == "policy"
