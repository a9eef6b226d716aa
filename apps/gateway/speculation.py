"""When the ledger reservation may run at the same time as the Redis admission.

The brief orders the checks cheapest first: the Redis admission (streams, rpm, tokens per day)
before the PostgreSQL reservation, so a key hammering at its limits is refused by Redis and never
reaches PostgreSQL. Done one after the other they are two serial round trips before the first
token. For a key that has room both checks almost always pass, so the gateway runs them
concurrently, and falls back to the strict order whenever the key is at or near a limit:

* a key without limits (nothing Redis can refuse but an outage) always overlaps;
* otherwise this replica remembers the key's last admission answer; it overlaps only when that
  answer admitted and left headroom (free stream slots, requests left in the rpm window, tokens
  left today), and it never has more overlapped requests of one key in flight than that
  headroom. A key with no answer on record yet runs in order.

So a mis-guess (Redis refuses a request whose reservation already ran; the reservation is then
cancelled) costs at most "headroom" extra PostgreSQL round trips per burst and per replica, and
a key at its limit costs PostgreSQL nothing, as in the strict order. The client sees the same
answer either way: when both checks refuse, the admission's refusal (429) wins, as in order.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from apps.core.quota.admission import Admission, Limits


def _unlimited(limits: Limits) -> bool:
    return not (limits.max_streams or limits.rpm or limits.tokens_per_day)


def headroom(adm: Admission) -> int:
    """How many more requests the key's limits allowed after this answer (0 if it refused)."""
    if not adm.admitted:
        return 0
    room: list[int] = []
    limits = adm.limits
    if limits.max_streams:
        room.append(limits.max_streams - adm.active_streams)
    if limits.rpm:
        room.append(limits.rpm - adm.requests_in_window)
    if limits.tokens_per_day and adm.tokens_today >= limits.tokens_per_day:
        room.append(0)
    return max(min(room), 0) if room else 1 << 30


@dataclass
class _Key:
    headroom: int = 0
    in_flight: int = 0


class Speculation:
    """Per-replica memory of each key's last admission answer (bounded, least recently used out)."""

    def __init__(self, max_keys: int = 10_000) -> None:
        self._keys: OrderedDict[str, _Key] = OrderedDict()
        self._max_keys = max_keys

    def begin(self, subject: str, limits: Limits) -> bool:
        """True: run the reservation alongside the admission (call `end` afterwards)."""
        if _unlimited(limits):
            return True
        state = self._keys.get(subject)
        if state is None or state.in_flight >= state.headroom:
            return False
        state.in_flight += 1
        return True

    def end(self, subject: str, limits: Limits) -> None:
        if _unlimited(limits):
            return
        state = self._keys.get(subject)
        if state is not None and state.in_flight > 0:
            state.in_flight -= 1

    def record(self, subject: str, adm: Admission) -> None:
        """Remember the newest answer Redis gave for this key."""
        if _unlimited(adm.limits):
            return
        state = self._keys.get(subject)
        if state is None:
            state = self._keys[subject] = _Key()
            if len(self._keys) > self._max_keys:
                self._keys.popitem(last=False)
        else:
            self._keys.move_to_end(subject)
        state.headroom = headroom(adm)

    def in_flight(self, subject: str) -> int:
        state = self._keys.get(subject)
        return state.in_flight if state else 0
