"""A golden set and how a candidate revision's answers are graded (issue 30 item 2). No I/O but
reading the suite file; `evalrun.py` gets the answers, `evalgate.py` signs and checks the result.

A suite is YAML (or JSON):

    name: support-bot-golden          # optional
    min_pass_ratio: 1.0               # share of cases that must pass (default: all)
    cases:
      - name: capital
        messages: [{role: user, content: "Capital of France? One word."}]
        max_tokens: 8
        expect: {exact: "Paris"}      # the answer, whitespace at either end ignored
      - name: order-json
        messages: [{role: user, content: "The order as JSON."}]
        expect:
          json_schema: {type: object, required: [id], properties: {id: {type: integer}}}

Every case runs at temperature 0. A case passes when its answer came from the evaluated revision
(the `x-llmfleet-model-revision` the platform names) and meets its expectation. The revision passes
when at least `min_pass_ratio` of the cases pass and the TTFT p95 over the cases (nearest rank) is
within the stack's SLO (`slo.ttft_p95_s`).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from apps.modelsync.sync import ModelSyncError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Expect(_Strict):
    exact: str | None = None
    json_schema: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one(self) -> Expect:
        if (self.exact is None) == (self.json_schema is None):
            raise ValueError("expect needs exactly one of `exact` or `json_schema`")
        if self.json_schema is not None:
            try:
                Draft202012Validator.check_schema(self.json_schema)
            except SchemaError as exc:
                raise ValueError(f"json_schema is not a valid JSON Schema: {exc.message}") from None
        return self


class Case(_Strict):
    name: str = Field(min_length=1, max_length=128)
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int = Field(default=64, ge=1, le=8192)
    expect: Expect


class Suite(_Strict):
    name: str = ""
    min_pass_ratio: float = Field(default=1.0, gt=0, le=1)
    cases: list[Case] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> Suite:
        names = [c.name for c in self.cases]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"case names repeat: {', '.join(repeated)}")
        return self


def load_suite(path: Path) -> tuple[Suite, str]:
    """The suite at `path` and the SHA-256 of its bytes (the signed result names it)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ModelSyncError(f"--suite {path}: {exc.strerror or exc}", param="suite") from None
    try:
        data = yaml.safe_load(raw)
        return Suite.model_validate(data), hashlib.sha256(raw).hexdigest()
    except yaml.YAMLError as exc:
        raise ModelSyncError(f"--suite {path}: not YAML ({exc.__class__.__name__})", param="suite") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "suite"
        raise ModelSyncError(f"--suite {path}: {where}: {first['msg']}", param="suite") from None


def grade(expect: Expect, text: str) -> str | None:
    """None when `text` meets the expectation, else why not (one line, never the text itself)."""
    if expect.exact is not None:
        return None if text.strip() == expect.exact.strip() else "not the expected answer"
    assert expect.json_schema is not None
    try:
        value = json.loads(text)
    except ValueError:
        return "not JSON"
    error = next(iter(Draft202012Validator(expect.json_schema).iter_errors(value)), None)
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "the document"
    return f"JSON does not match the schema at {where} ({error.validator})"


@dataclass(frozen=True)
class Answer:
    """One case's answer as the platform returned it."""

    case: str
    text: str
    ttft_s: float | None  # None: no content arrived
    revision: str  # the revision the platform said answered ("" not said)
    error: str | None = None  # the request failed: its OpenAI error code or status


@dataclass(frozen=True)
class CaseResult:
    name: str
    passed: bool
    reason: str | None
    ttft_s: float | None


def p95(values: list[float]) -> float | None:
    """Nearest-rank 95th percentile (None for no values)."""
    if not values:
        return None
    ranked = sorted(values)
    return ranked[max(0, math.ceil(0.95 * len(ranked)) - 1)]


def verdict(suite: Suite, answers: list[Answer], revision: str, slo_ttft_p95_s: float) -> dict[str, Any]:
    """The evaluation's result (what `evalgate.py` signs): per case, the pass ratio, the latency check
    and `passed`. Answers carry no text into it: a result names what failed, never content."""
    by_case = {a.case: a for a in answers}
    results: list[CaseResult] = []
    for case in suite.cases:
        answer = by_case.get(case.name)
        reason: str | None
        if answer is None or answer.error is not None:
            reason = "no answer" if answer is None else f"request failed: {answer.error}"
            results.append(CaseResult(case.name, False, reason, None))
            continue
        if answer.revision != revision:
            reason = f"answered by revision {answer.revision or '(not said)'}, not {revision}"
        else:
            reason = grade(case.expect, answer.text)
        results.append(CaseResult(case.name, reason is None, reason, answer.ttft_s))
    ratio = sum(r.passed for r in results) / len(results)
    ttft = p95([r.ttft_s for r in results if r.ttft_s is not None])
    latency_ok = ttft is not None and ttft <= slo_ttft_p95_s
    return {
        "cases": [asdict(r) for r in results],
        "pass_ratio": round(ratio, 4),
        "min_pass_ratio": suite.min_pass_ratio,
        "ttft_p95_s": None if ttft is None else round(ttft, 4),
        "slo_ttft_p95_s": slo_ttft_p95_s,
        "latency_ok": latency_ok,
        "passed": ratio >= suite.min_pass_ratio and latency_ok,
    }
