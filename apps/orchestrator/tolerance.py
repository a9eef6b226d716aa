"""What a node's usage report must agree with: the content events it relayed (issue 27 item 2).

The orchestrator never parses the relayed SSE (docs/architecture.md D5); counting the `data:` events of a `chunk`
frame is a C-level substring count on text it already holds. `UsageTolerance` is the rule the
settle script (`settle.py`) and the relay's own settle of a mid-stream error (`relay.py`) apply.
"""

from __future__ import annotations

from dataclasses import dataclass

_EVENT = "data:"


def content_events(delta: str) -> int:
    """The SSE events in a `chunk.delta` (one `data: {...}` per event; the JSON of an event holds no
    raw newline, so the text `data:` inside a completion can only add to the count, never hide one)."""
    return delta.count(_EVENT)


@dataclass(frozen=True)
class UsageTolerance:
    """How far a node's completion count may exceed the content events it relayed.

    The orchestrator counts the `data:` events of every `chunk` a node relays for a request it
    was assigned (no JSON parse). vLLM sends one content event per generated token per choice,
    but merges several tokens into one event when its HTTP side falls behind, and generates some
    tokens without an event (a tool parser's control tokens, the final token folded into the
    finish event), so the count is not exact; a report is accepted up to `tokens_per_event` x
    events + `slack_tokens`. Beyond that the node's report disagrees with what it relayed: the
    lower count (the events) is settled, the node is quarantined and the disagreement counted
    (`llmfleet_orchestrator_usage_unrelayed_total`, alert `LlmfleetNodeUsageUnrelayed`)."""

    tokens_per_event: int = 4
    slack_tokens: int = 16

    def settled(self, completion: int, events: int) -> int:
        """The completion to settle for a report of `completion` over `events` relayed events."""
        return completion if completion <= self.bound(events) else min(completion, events)

    def bound(self, events: int) -> int:
        return events * self.tokens_per_event + self.slack_tokens
