"""The incremental scanner of one streamed answer's choice: fed its text deltas in order, it returns what
can be sent now, redacted, and holds back only the trailing characters that could still become part of
a match (`apps.core.guardrails.scan`). Pure: no I/O, no clock.

The hold-back is bounded by the checks' longest prefix pattern (`scan.hold_bounds`, at most
`MAX_HOLD_CHARS` = 128 characters, reached only while the tail really could still be an address or a
number), and ordinary text flows: a delta ending in a space or punctuation after words releases at once;
one ending inside a word or a run of digits keeps that word or run until the next delta shows how it
ends (an email address or a number may continue). `finish()` releases the rest.
"""

from __future__ import annotations

from collections.abc import Sequence

from apps.core.guardrails.decisions import Decision
from apps.core.guardrails.policy import Check
from apps.core.guardrails.scan import Outcome, hold_bounds, scan_window


class OutputScanner:
    """One choice of one answer. `feed` and `finish` return an `Outcome`: its `text` to send now, its
    `decisions` (each match once, when decided) and `blocked` (send `text`, then end the stream with
    `GuardrailBlocked`); after a block every call returns the block again and no text."""

    def __init__(self, checks: Sequence[Check], *, field: str = "choices.0") -> None:
        self._checks = tuple(checks)
        self._field = field
        self.max_hold, self._context_chars = hold_bounds(self._checks)
        self._context = ""  # the last released characters, as lookbehinds read them (never sent again)
        self._held = ""
        self.blocked: Decision | None = None
        self._finished = False

    @property
    def held(self) -> int:
        """How many characters are held back now."""
        return len(self._held)

    def feed(self, delta: str) -> Outcome:
        """What of this delta (and of what was held) can be sent now."""
        return self._step(delta, final=False)

    def finish(self) -> Outcome:
        """The end of the choice: everything held is decided and released."""
        return self._step("", final=True)

    def _step(self, delta: str, *, final: bool) -> Outcome:
        if self._finished:
            raise RuntimeError("the scanner's choice has ended")
        if self.blocked is not None:
            return Outcome(0, "", (), self.blocked)
        self._finished = final
        if not self._checks:
            text, self._held = self._held + delta, ""
            return Outcome(len(text), text, (), None)
        window = self._context + self._held + delta
        pos = len(self._context)
        outcome = scan_window(self._checks, window, pos, final=final, direction="output", field=self._field)
        if outcome.blocked is not None:
            self.blocked, self._held = outcome.blocked, ""
            return outcome
        self._context = window[max(0, outcome.cut - self._context_chars) : outcome.cut]
        self._held = window[outcome.cut :]
        return outcome
