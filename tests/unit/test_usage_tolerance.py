"""The rule a node's completion count is held to (apps/orchestrator/tolerance.py, issue 27 item 2)."""

from __future__ import annotations

from apps.orchestrator.tolerance import UsageTolerance, content_events
from tests.fakes.fake_node import vllm_chunk


def test_events_are_counted_per_sse_event_without_parsing() -> None:
    one = vllm_chunk("r", "m", "a")
    assert content_events(one) == 1
    assert content_events(one * 3) == 3  # several events coalesced into one chunk frame
    assert content_events("") == 0


def test_a_report_within_the_tolerance_settles_as_reported_and_beyond_it_the_relayed_count() -> None:
    rule = UsageTolerance(tokens_per_event=4, slack_tokens=16)
    assert rule.bound(5) == 36
    assert rule.settled(36, 5) == 36  # vLLM merged tokens into events: accepted
    assert rule.settled(37, 5) == 5  # beyond: the lower count, what was relayed
    assert rule.settled(200, 5) == 5  # the probe's 5 sent, 200 reported
    assert rule.settled(16, 0) == 16  # the slack: tokens with no event of their own
    assert rule.settled(3, 5) == 3  # a report below the count is never raised
