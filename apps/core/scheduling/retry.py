"""The orchestrator's retry policy before output, shared with `llmfleet simulate`.

A request runs on at most `MAX_ATTEMPTS` nodes (one retry on another node) while nothing has been
sent to the client. An assignment that reached no node (its socket was moving between replicas,
nobody listened on its channel) ran nothing, so it is tried again without using up an attempt,
`MAX_UNREACHABLE` times at most. Each try queues within what is left of the request's queue
limit; a retry always gets at least `RETRY_MIN_QUEUE_S` to queue.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_ATTEMPTS = 2
MAX_UNREACHABLE = 4
RETRY_MIN_QUEUE_S = 1.0


@dataclass(slots=True)
class RetryBudget:
    attempts: int = 0  # tries that reached a node and failed before output
    unreachable: int = 0  # tries that reached no node (not counted as attempts, up to the cap)

    def left(self) -> bool:
        """Another node may be tried."""
        return self.attempts < MAX_ATTEMPTS

    def spend(self, *, reached: bool) -> None:
        """A try failed before output; `reached`: the node got the request."""
        if not reached and self.unreachable < MAX_UNREACHABLE:
            self.unreachable += 1
        else:
            self.attempts += 1


def queue_budget(limit_s: float, elapsed_s: float, *, retrying: bool) -> float:
    """Seconds the next try may wait in the queue: what is left of the limit since the request
    arrived (at least `RETRY_MIN_QUEUE_S` for a retry)."""
    remaining = limit_s - elapsed_s
    return max(RETRY_MIN_QUEUE_S, remaining) if retrying else remaining
