"""A team's guardrail policy: the JSON document the admin API stores (`GuardrailPolicy`), its validation
into one error naming the field (`parse_policy`), and the compiled form the scanners run
(`compile_policy`). The document's fields and an example: docs/guardrails.md.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from apps.core.errors import InvalidRequest
from apps.core.guardrails.custom import MAX_PATTERN_CHARS, MAX_PATTERNS, custom_detector
from apps.core.guardrails.decisions import Action, Direction
from apps.core.guardrails.detectors import BUILTIN, Detector
from apps.core.guardrails.syntax import PatternError

PATTERN_NAME = r"^[a-z][a-z0-9_]{0,31}$"
DIRECTIONS: tuple[Direction, ...] = ("input", "output")
MAX_CHECKS = 32  # per direction (each detector at most once: 4 built-in + MAX_PATTERNS)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CheckSpec(_Strict):
    """One check of a direction: a detector (built-in or a pattern's name) and what a match does."""

    detector: Annotated[StrictStr, Field(min_length=1, max_length=32)]
    action: Action


class PatternSpec(_Strict):
    """A team's own pattern (`apps.core.guardrails.custom`): `name` is its detector's name."""

    name: Annotated[StrictStr, Field(pattern=PATTERN_NAME)]
    pattern: Annotated[StrictStr, Field(min_length=1, max_length=MAX_PATTERN_CHARS)]

    @field_validator("pattern")
    @classmethod
    def _runs_on_re2(cls, value: str) -> str:
        try:
            custom_detector("check", value)
        except PatternError as exc:
            raise ValueError(str(exc)) from None
        return value


class GuardModelSpec(_Strict):
    """A chat model of the stack asked for a safe/unsafe verdict (`apps.core.guardrails.guard_model`)."""

    model: Annotated[StrictStr, Field(min_length=1, max_length=128)]
    template: Literal["instruct", "llama_guard"] = "instruct"
    input: StrictBool = True
    output: StrictBool = False
    action: Literal["block", "flag"] = "block"
    fail_closed: StrictBool = True  # an answer that is neither "safe" nor "unsafe" counts as unsafe

    @model_validator(mode="after")
    def _checks_something(self) -> GuardModelSpec:
        if not (self.input or self.output):
            raise ValueError("set 'input' or 'output' (or both): otherwise the guard model checks nothing")
        return self


class GuardrailPolicy(_Strict):
    input: list[CheckSpec] = Field(default_factory=list, max_length=MAX_CHECKS)
    output: list[CheckSpec] = Field(default_factory=list, max_length=MAX_CHECKS)
    patterns: list[PatternSpec] = Field(default_factory=list, max_length=MAX_PATTERNS)
    guard_model: GuardModelSpec | None = None

    def as_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def _field_path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "policy"


def parse_policy(data: object, *, chat_models: Collection[str] | None = None) -> GuardrailPolicy:
    """The validated policy, or `InvalidRequest` naming the first bad field (`param`, e.g.
    `patterns.0.pattern`, `output.1.detector`). `chat_models`: the stack's chat models, which a guard
    model must be one of (None: not checked)."""
    if not isinstance(data, dict):
        raise InvalidRequest("A guardrail policy is a JSON object.", param="policy")
    try:
        policy = GuardrailPolicy.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        path = _field_path(tuple(first["loc"]))
        reason = first["msg"].removeprefix("Value error, ")
        raise InvalidRequest(f"{path}: {reason}", param=path) from None
    _check_names(policy)
    if (
        policy.guard_model is not None
        and chat_models is not None
        and policy.guard_model.model not in chat_models
    ):
        raise InvalidRequest(
            f"guard_model.model: '{policy.guard_model.model[:128]}' is not a chat model of this stack",
            param="guard_model.model",
        )
    return policy


def _check_names(policy: GuardrailPolicy) -> None:
    names: list[str] = []
    for i, spec in enumerate(policy.patterns):
        if spec.name in BUILTIN or spec.name in names:
            raise InvalidRequest(
                f"patterns.{i}.name: '{spec.name}' is taken (built-in detectors: {', '.join(BUILTIN)})",
                param=f"patterns.{i}.name",
            )
        names.append(spec.name)
    known = [*BUILTIN, *names]
    for direction in DIRECTIONS:
        seen: set[str] = set()
        for i, check in enumerate(policy.input if direction == "input" else policy.output):
            param = f"{direction}.{i}.detector"
            if check.detector not in known:
                raise InvalidRequest(
                    f"{param}: unknown detector '{check.detector}'; use one of: {', '.join(known)}",
                    param=param,
                )
            if check.detector in seen:
                raise InvalidRequest(
                    f"{param}: '{check.detector}' is checked twice on {direction}", param=param
                )
            seen.add(check.detector)


@dataclass(frozen=True)
class Check:
    detector: Detector
    action: Action

    @property
    def name(self) -> str:
        return self.detector.name


@dataclass(frozen=True)
class CompiledPolicy:
    """A validated policy with its patterns compiled: what a request's scan uses (built once per policy
    and cached by the store)."""

    policy: GuardrailPolicy
    input: tuple[Check, ...]
    output: tuple[Check, ...]

    @property
    def guard_model(self) -> GuardModelSpec | None:
        return self.policy.guard_model


def compile_policy(policy: GuardrailPolicy) -> CompiledPolicy:
    detectors = {**BUILTIN, **{p.name: custom_detector(p.name, p.pattern) for p in policy.patterns}}
    return CompiledPolicy(
        policy,
        tuple(Check(detectors[c.detector], c.action) for c in policy.input),
        tuple(Check(detectors[c.detector], c.action) for c in policy.output),
    )
