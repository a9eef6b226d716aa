"""The golden set's grading (apps/modelsync/evalsuite.py): what a suite file may say, each check's
positives and negatives, and the verdict's rules (answer's revision, failed requests, latency, the
pass ratio). No I/O but the suite file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apps.modelsync.evalsuite import Answer, Expect, Suite, grade, load_suite, p95, verdict
from apps.modelsync.sync import ModelSyncError

pytestmark = pytest.mark.timeout(30)

SCHEMA = {"type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}}}


def _suite(**kw: object) -> Suite:
    cases = [
        {"name": "capital", "messages": [{"role": "user", "content": "?"}], "expect": {"exact": "Paris"}},
        {"name": "order", "messages": [{"role": "user", "content": "?"}], "expect": {"json_schema": SCHEMA}},
    ]
    return Suite.model_validate({"cases": cases, **kw})


@pytest.mark.parametrize(
    ("expect", "text", "reason"),
    [
        ({"exact": "Paris"}, "Paris", None),
        ({"exact": "Paris"}, "  Paris\n", None),  # whitespace at either end
        ({"exact": "Paris"}, "paris", "not the expected answer"),
        ({"exact": "Paris"}, "Paris, France", "not the expected answer"),
        ({"exact": "Paris"}, "", "not the expected answer"),
        ({"json_schema": SCHEMA}, '{"id": 7}', None),
        ({"json_schema": SCHEMA}, ' {"id": 7, "extra": true} ', None),
        ({"json_schema": SCHEMA}, '{"id": "7"}', "JSON does not match the schema at id (type)"),
        ({"json_schema": SCHEMA}, "{}", "JSON does not match the schema at the document (required)"),
        ({"json_schema": SCHEMA}, "The order is 7", "not JSON"),
        ({"json_schema": SCHEMA}, '{"id": 7', "not JSON"),
    ],
)
def test_each_check_passes_what_it_should_and_only_that(expect: dict, text: str, reason: str | None) -> None:
    assert grade(Expect.model_validate(expect), text) == reason


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("cases: []", "cases: List should have at least 1 item"),
        ("cases: [{name: a, messages: [{role: user, content: x}], expect: {}}]", "exactly one of"),
        (
            "cases: [{name: a, messages: [{role: user, content: x}], expect: {exact: x, json_schema: {}}}]",
            "exactly one of",
        ),
        (
            "cases: [{name: a, messages: [{role: user, content: x}], expect: {json_schema: {type: 5}}}]",
            "not a valid JSON Schema",
        ),
        (
            "cases: [{name: a, messages: [{role: user, content: x}], expect: {exact: x}},"
            " {name: a, messages: [{role: user, content: y}], expect: {exact: y}}]",
            "case names repeat: a",
        ),
        ("cases: [{name: a, messages: [], expect: {exact: x}}]", "cases.0.messages"),
        ("cases: [{name: a, messages: [{role: user, content: x}], expect: {exact: x}, tools: []}]", "tools"),
        (
            "min_pass_ratio: 0\ncases: [{name: a, messages: [{role: u}], expect: {exact: x}}]",
            "min_pass_ratio",
        ),
        ("cases: [unclosed", "not YAML"),
    ],
)
def test_a_bad_suite_is_one_clear_line(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "suite.yaml"
    path.write_text(body)
    with pytest.raises(ModelSyncError) as caught:
        load_suite(path)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_missing_suite_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ModelSyncError, match=r"suite\.yaml: No such file"):
        load_suite(tmp_path / "suite.yaml")


def test_the_suite_digest_is_of_its_bytes(tmp_path: Path) -> None:
    path = tmp_path / "suite.json"
    path.write_text(
        json.dumps({"cases": [{"name": "a", "messages": [{"role": "user"}], "expect": {"exact": "x"}}]})
    )
    suite, sha = load_suite(path)
    assert suite.cases[0].max_tokens == 64
    path.write_text(path.read_text() + " ")
    assert load_suite(path)[1] != sha


def test_p95_is_the_nearest_rank() -> None:
    assert p95([]) is None
    assert p95([0.3]) == 0.3
    assert p95([float(i) for i in range(1, 21)]) == 19.0  # rank ceil(0.95 x 20) = 19
    assert p95([float(i) for i in range(1, 101)]) == 95.0


def test_the_verdict_passes_only_right_answers_from_the_revision_within_the_slo() -> None:
    suite = _suite()
    good = [Answer("capital", "Paris", 0.2, "r2"), Answer("order", '{"id": 1}', 0.4, "r2")]
    result = verdict(suite, good, "r2", slo_ttft_p95_s=3.0)
    assert (result["passed"], result["pass_ratio"], result["ttft_p95_s"], result["latency_ok"]) == (
        True,
        1.0,
        0.4,
        True,
    )
    assert "Paris" not in json.dumps(result)  # names what failed, never content

    # Answered by another revision (the pin did not hold): that case fails.
    other = [good[0], Answer("order", '{"id": 1}', 0.4, "r1")]
    result = verdict(suite, other, "r2", slo_ttft_p95_s=3.0)
    assert result["passed"] is False
    assert result["cases"][1]["reason"] == "answered by revision r1, not r2"

    # A failed request is a failed case, with its code.
    failed = [good[0], Answer("order", "", None, "", error="503 revision_not_served")]
    result = verdict(suite, failed, "r2", slo_ttft_p95_s=3.0)
    assert result["cases"][1] == {
        "name": "order",
        "passed": False,
        "reason": "request failed: 503 revision_not_served",
        "ttft_s": None,
    }

    # Right answers, too slow: the latency check fails the revision.
    slow = [Answer("capital", "Paris", 0.2, "r2"), Answer("order", '{"id": 1}', 3.5, "r2")]
    result = verdict(suite, slow, "r2", slo_ttft_p95_s=3.0)
    assert (result["pass_ratio"], result["latency_ok"], result["passed"]) == (1.0, False, False)

    # min_pass_ratio: one of two may fail.
    half = [Answer("capital", "Lyon", 0.2, "r2"), good[1]]
    assert verdict(suite, half, "r2", 3.0)["passed"] is False
    assert verdict(_suite(min_pass_ratio=0.5), half, "r2", 3.0)["passed"] is True

    # No content at all: no TTFT, so no latency evidence: not passed.
    assert verdict(suite, [], "r2", 3.0)["latency_ok"] is False
