"""Scanning one piece of text with a direction's checks: find, decide, redact. Pure, no I/O.

`scan_window` is the one algorithm, for a whole text (`final=True`: `scan_text`, the request's fields)
and for the growing window of a stream (`apps.core.guardrails.stream`). In a stream it releases text
only up to a cut before which everything is decided whatever comes next:

- every rule finds its candidates from `pos`, and says from where the rest of the window could still
  be read by it as more text arrives (`Rule.viable_from`, the prefix patterns of
  `apps.core.guardrails.forms`); a candidate starting before that is final, the cut starts at the
  earliest such position of all rules;
- the cut moves back to the start of any candidate that spans it (valid or not, any check), so that a
  rule's next search starts where the whole text's search would find its next candidate;
- candidates ending before the cut are decided: per check the leftmost non-overlapping ones count
  (one decision each); across the redacting checks the leftmost, then longest, is replaced by
  `[REDACTED:<LABEL>]`.

So the released text of any split of a text equals the text's one-shot redaction
(tests/unit/test_guardrails_stream.py checks it on random splits). A blocking candidate is reported as
soon as it is final, before the text around it is released.
"""

from __future__ import annotations

from dataclasses import dataclass

from apps.core.guardrails.decisions import Decision, Direction
from apps.core.guardrails.policy import Check
from apps.core.guardrails.rules import Candidate

# The characters of released text a stream keeps as context: lookbehinds and anchors read at most
# this far before a candidate (checked for every rule by `hold_bounds`).
CONTEXT_CHARS = 16
# The most characters a stream ever holds back: every rule's prefix patterns span at most this much.
MAX_HOLD_CHARS = 128


@dataclass(frozen=True)
class Hit:
    check: int  # index in the checks
    candidate: Candidate  # final: it starts before its rule's viable point, whatever text comes next


@dataclass(frozen=True)
class Outcome:
    cut: int  # the window's text before `cut` is released (as `text`) and done with
    text: str
    decisions: tuple[Decision, ...]
    blocked: Decision | None


def hold_bounds(checks: tuple[Check, ...]) -> tuple[int, int]:
    """(the most a stream holds back, the context it needs) for `checks`; both within the stated bounds."""
    rules = [rule for check in checks for rule in check.detector.rules]
    hold = max((rule.reach for rule in rules), default=0)
    context = max((rule.behind for rule in rules), default=0)
    if hold > MAX_HOLD_CHARS or context > CONTEXT_CHARS:
        raise ValueError(f"a rule holds back {hold} or reads {context} characters before a match")
    return hold, context


def _collect(checks: tuple[Check, ...], window: str, pos: int, final: bool) -> tuple[list[Hit], int]:
    hits: list[Hit] = []
    viable = len(window)
    for index, check in enumerate(checks):
        for rule in check.detector.rules:
            rule_viable = len(window) if final else rule.viable_from(window, pos)
            viable = min(viable, rule_viable)
            for candidate in rule.candidates(window, pos):
                if candidate.start >= rule_viable:
                    break  # undecided, and it cannot span the cut (which is at most `viable`)
                hits.append(Hit(index, candidate))
    return hits, viable


def _cut(hits: list[Hit], viable: int) -> int:
    cut = viable
    while True:
        lowered = min(
            (h.candidate.start for h in hits if h.candidate.start < cut < h.candidate.end), default=cut
        )
        if lowered == cut:
            return cut
        cut = lowered


def _leftmost(hits: list[Hit]) -> list[Hit]:
    """The leftmost, then longest, non-overlapping hits (ties: the earlier check)."""
    kept: list[Hit] = []
    for hit in sorted(hits, key=lambda h: (h.candidate.start, h.candidate.start - h.candidate.end, h.check)):
        if not kept or hit.candidate.start >= kept[-1].candidate.end:
            kept.append(hit)
    return kept


def _redacted(checks: tuple[Check, ...], window: str, pos: int, cut: int, hits: list[Hit]) -> str:
    parts: list[str] = []
    at = pos
    for hit in _leftmost([h for h in hits if checks[h.check].action == "redact"]):
        parts += [window[at : hit.candidate.value_start], f"[REDACTED:{checks[hit.check].detector.label}]"]
        at = hit.candidate.value_end
    parts.append(window[at:cut])
    return "".join(parts)


def scan_window(
    checks: tuple[Check, ...], window: str, pos: int, *, final: bool, direction: Direction, field: str
) -> Outcome:
    """Release `window[pos:cut]`: decided, redacted. `final`: no more text comes (release it all)."""
    hits, viable = _collect(checks, window, pos, final)
    cut = _cut(hits, viable)
    blocking = [h for h in hits if h.candidate.valid and checks[h.check].action == "block"]
    blocked = min(blocking, key=lambda h: h.candidate.start, default=None)
    if blocked is not None:  # the answer ends here: release what is decided before it
        cut = _cut(hits, min(cut, blocked.candidate.start))
    done = [h for h in hits if h.candidate.valid and h.candidate.end <= cut]
    counted = sorted(
        (h for index in range(len(checks)) for h in _leftmost([h for h in done if h.check == index])),
        key=lambda h: (h.candidate.start, h.check),
    )
    decisions = [Decision(direction, checks[h.check].name, checks[h.check].action, field) for h in counted]
    block = None
    if blocked is not None:
        block = Decision(direction, checks[blocked.check].name, "block", field)
        decisions.append(block)
    return Outcome(cut, _redacted(checks, window, pos, cut, done), tuple(decisions), block)


def scan_text(checks: tuple[Check, ...], text: str, *, direction: Direction, field: str) -> Outcome:
    """One whole text (a request's field, or a stream's rest at its end)."""
    return scan_window(checks, text, 0, final=True, direction=direction, field=field)
