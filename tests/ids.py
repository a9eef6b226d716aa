"""Names unique to this test run, for whatever reaches state another run on the machine shares.

Redis keys live in a logical DB this run claimed and PostgreSQL rows in scratch databases
(`tests/conftest.py`), but Redis pub/sub channels are server-wide: every orchestrator, gateway
and `NodeStore` of this run (in-process or child processes, which inherit the environment) uses
`CHANNEL_NAMESPACE`, set as `LLMFLEET_CHANNEL_NAMESPACE` by `tests/conftest.py`. Anything else
that must not collide with a concurrent run gets `unique(name)`.
"""

from __future__ import annotations

import os
import uuid

# Child pytest processes (none today) would share their parent's run id through the environment.
RUN_ID = os.environ.get("LLMFLEET_TEST_RUN_ID") or uuid.uuid4().hex[:10]
CHANNEL_NAMESPACE = f"test-{RUN_ID}"


def unique(name: str) -> str:
    """`name` with this run's suffix."""
    return f"{name}-{RUN_ID}"
