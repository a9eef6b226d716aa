"""`derive_state`: the documented transitions as a table."""

from __future__ import annotations

import pytest

from apps.core.nodes.state import NodeState, derive_state


@pytest.mark.parametrize(
    ("revoked", "present", "age", "draining", "expected"),
    [
        (False, True, 1.0, False, NodeState.READY),
        (False, True, 1.0, True, NodeState.DRAINING),
        (False, True, 10.0, False, NodeState.READY),  # exactly 2 intervals: not yet stale
        (False, True, 10.1, False, NodeState.STALE),  # 2 missed heartbeats
        (False, True, 10.1, True, NodeState.STALE),
        (False, False, None, False, NodeState.DEAD),  # key expired
        (True, True, 1.0, False, NodeState.REVOKED),  # revocation wins over everything
        (True, False, None, False, NodeState.REVOKED),
    ],
)
def test_derive_state(
    revoked: bool, present: bool, age: float | None, draining: bool, expected: NodeState
) -> None:
    state = derive_state(
        revoked=revoked,
        heartbeat_present=present,
        heartbeat_age_s=age,
        draining=draining,
        heartbeat_interval_s=5.0,
    )
    assert state is expected
