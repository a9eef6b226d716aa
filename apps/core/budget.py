"""A request's token budget: the one owner of its bounds (issue 28).

The gateway builds a `Budget` once, from its validation (`apps/gateway/validate.py`): the prompt
bound (its conservative estimate) and the completion bound (`n` x the effective `max_tokens`),
the worst case it reserved money for. It travels in the dispatch request and the assignment, and:

* `clamp` is the only cap of reported usage in Python; the settle script
  (`apps/orchestrator/settle.py`, which must cap atomically) reads the fields `to_fields` wrote
  into the assignment's Redis hash and applies the same rule (tests/integration/test_budget_lua.py
  holds the two against each other);
* `after` is the only remainder for a resumed stream (what the second node may still generate);
* `to_fields`/`from_fields` are the only serialisation into the assignment's hash `req:{id}`.

A bound of None (a dispatch from an older gateway, which knew none) caps nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

# The assignment hash's field names (read by the settle script: keep them).
PROMPT_FIELD = "max_prompt"
COMPLETION_FIELD = "max_completion"
N_FIELD = "n"


class Usage(NamedTuple):
    prompt_tokens: int
    completion_tokens: int


class Clamped(NamedTuple):
    usage: Usage
    capped: bool  # a reported count was over its bound (the node over-reported)


@dataclass(frozen=True)
class Budget:
    prompt_tokens: int | None = None  # the prompt bound
    completion_tokens: int | None = None  # n x max_tokens
    n: int = 1

    @property
    def max_tokens(self) -> int | None:
        """The per-choice bound the engine is told (`max_tokens`)."""
        return None if self.completion_tokens is None else self.completion_tokens // max(self.n, 1)

    @property
    def bounded(self) -> bool:
        return self.prompt_tokens is not None and self.completion_tokens is not None

    @property
    def total(self) -> int | None:
        """The worst case in tokens (prompt + completion), None when unbounded."""
        if self.prompt_tokens is None or self.completion_tokens is None:
            return None
        return self.prompt_tokens + self.completion_tokens

    def clamp(self, usage: Usage | None) -> Clamped:
        """Reported usage within the bounds (missing usage counts as none)."""
        prompt, completion = usage if usage is not None else Usage(0, 0)
        capped = False
        if self.prompt_tokens is not None and prompt > self.prompt_tokens:
            prompt, capped = self.prompt_tokens, True
        if self.completion_tokens is not None and completion > self.completion_tokens:
            completion, capped = self.completion_tokens, True
        return Clamped(Usage(prompt, completion), capped)

    def after(self, emitted: int) -> Budget | None:
        """What is left for a single-choice stream resumed after `emitted` completion tokens
        reached the client; None when nothing is (the bound is spent)."""
        if self.completion_tokens is None:
            return self
        left = self.completion_tokens - emitted
        return Budget(self.prompt_tokens, left, 1) if left >= 1 else None

    def to_fields(self) -> dict[str, int]:
        """The fields of the assignment hash the settle script caps at (none when unbounded)."""
        if not self.bounded:
            return {}
        assert self.prompt_tokens is not None
        assert self.completion_tokens is not None
        return {PROMPT_FIELD: self.prompt_tokens, COMPLETION_FIELD: self.completion_tokens, N_FIELD: self.n}

    @classmethod
    def from_fields(cls, fields: Mapping[str | bytes, str | bytes | int]) -> Budget:
        def get(name: str) -> int | None:
            raw = fields.get(name, fields.get(name.encode()))
            if raw is None or raw == "" or raw == b"":
                return None
            return int(raw)

        return cls(get(PROMPT_FIELD), get(COMPLETION_FIELD), get(N_FIELD) or 1)


UNBOUNDED = Budget()
