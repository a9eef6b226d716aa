"""What a guardrail check decided, and the error a block becomes.

A decision names the check, the action and where it applied (a field path such as
`messages.2.content`, or the answer's choice), never the text it matched: decisions are counted,
logged and answered with, and the policy's whole point is that the content is not repeated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from apps.core.errors import InvalidRequest

Action = Literal["redact", "block", "flag"]
Direction = Literal["input", "output"]


@dataclass(frozen=True)
class Decision:
    direction: Direction
    check: str  # a detector's name (`ssn`, a custom pattern's name) or `guard_model`
    action: Action
    field: str  # where: `messages.0.content`, `prompt`, `input.1`, or the answer's choice


class GuardrailBlocked(InvalidRequest):
    """A check with `action: block` matched: the request is refused (400 before anything is reserved),
    or the answer's stream ends with this error. The message names the check and the field only."""

    code = "guardrail_blocked"

    def __init__(self, decision: Decision) -> None:
        what = "request" if decision.direction == "input" else "answer"
        super().__init__(
            f"This {what} was blocked by the team's guardrail policy (check '{decision.check}' "
            f"in '{decision.field}').",
            param=decision.field,
        )
        self.decision = decision
