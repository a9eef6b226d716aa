"""The input side: one request body scanned with a policy's `input` checks (`scan_input`). Pure.

Scanned: every chat message's `content` when it is a string, and its text parts (`{"type": "text"}`,
`{"type": "input_text"}` or a bare string in the parts array); a completion's prompt when it is a string
(or a list holding one string); every string of an embeddings `input`. Not scanned: token id prompts and
inputs (no text to match), tool definitions, tool call arguments, names and media parts. The body
returned is a new dict and the original is never changed, so the caller can still tell what the
client sent from what goes upstream.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from apps.core.guardrails.decisions import Decision
from apps.core.guardrails.policy import Check
from apps.core.guardrails.scan import scan_text

Endpoint = Literal["chat", "completions", "embeddings"]
TEXT_PART_TYPES = frozenset({"text", "input_text"})


@dataclass(frozen=True)
class InputScan:
    body: dict[str, Any]  # what goes upstream: the redacted copy (the original is unchanged)
    decisions: tuple[Decision, ...]
    blocked: Decision | None  # refuse the request (`GuardrailBlocked`): the first blocking match


class _Fields:
    """Scans the body's texts one field at a time, stopping at the first block."""

    def __init__(self, checks: Sequence[Check]) -> None:
        self.checks = tuple(checks)
        self.decisions: list[Decision] = []
        self.blocked: Decision | None = None

    def text(self, value: str, field: str) -> str:
        if self.blocked is not None or not self.checks:
            return value
        outcome = scan_text(self.checks, value, direction="input", field=field)
        self.decisions.extend(outcome.decisions)
        self.blocked = outcome.blocked
        return value if outcome.blocked is not None else outcome.text

    def part(self, part: Any, field: str) -> Any:
        if isinstance(part, str):
            return self.text(part, field)
        if (
            isinstance(part, dict)
            and part.get("type") in TEXT_PART_TYPES
            and isinstance(part.get("text"), str)
        ):
            return {**part, "text": self.text(part["text"], f"{field}.text")}
        return part

    def message(self, message: Any, index: int) -> Any:
        if not isinstance(message, dict):
            return message
        content, field = message.get("content"), f"messages.{index}.content"
        if isinstance(content, str):
            return {**message, "content": self.text(content, field)}
        if isinstance(content, list):
            return {**message, "content": [self.part(p, f"{field}.{j}") for j, p in enumerate(content)]}
        return message

    def strings(self, value: Any, field: str, *, single: bool = False) -> Any:
        """A string, or a list of strings (of one string when `single`: a completion's prompt)."""
        if isinstance(value, str):
            return self.text(value, field)
        if isinstance(value, list) and (not single or len(value) == 1):
            return [self.text(v, f"{field}.{i}") if isinstance(v, str) else v for i, v in enumerate(value)]
        return value


def scan_input(checks: Sequence[Check], endpoint: Endpoint, body: Mapping[str, Any]) -> InputScan:
    """The request's texts scanned with `checks` (a compiled policy's `input`)."""
    fields = _Fields(checks)
    out = dict(body)
    if endpoint == "chat" and isinstance(body.get("messages"), list):
        out["messages"] = [fields.message(m, i) for i, m in enumerate(body["messages"])]
    elif endpoint == "completions" and "prompt" in body:
        out["prompt"] = fields.strings(body["prompt"], "prompt", single=True)
    elif endpoint == "embeddings" and "input" in body:
        out["input"] = fields.strings(body["input"], "input")
    return InputScan(out, tuple(fields.decisions), fields.blocked)
