"""The chaos suite's platform: real PostgreSQL and Redis (the shared fixtures), two
orchestrator processes, enginesim engines with agents, a gateway, all as child processes
through `LocalPlatform`; stopped (and checked for survivors) after each test."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from apps.cli.platform import MODEL_8B, LocalPlatform, NodeSpec, PlatformConfig
from tests.chaos.proxy import TcpProxy

# Simulated time runs this much faster than real time (enginesim --speed): keeps the suite
# to a few minutes on 2 cores while the platform's own timing stays real.
SPEED = 20.0

PlatformFactory = Callable[..., LocalPlatform]


def eight_b_nodes(n: int, onprem: int = 1, **kwargs: Any) -> list[NodeSpec]:
    tag = uuid.uuid4().hex[:6]  # pub/sub channels are shared by every Redis DB: unique ids
    return [
        NodeSpec(f"c{tag}-{i}", MODEL_8B, "onprem" if i < onprem else "cloud", **kwargs) for i in range(n)
    ]


@pytest.fixture
def proxies() -> Iterator[list[TcpProxy]]:
    """The TCP proxies a test starts, closed after it."""
    made: list[TcpProxy] = []
    yield made
    for p in made:
        p.close()


@pytest.fixture
def make_platform(migrated_db_url: str, redis_url: str, tmp_path: Path) -> Iterator[PlatformFactory]:
    started: list[LocalPlatform] = []

    def factory(**overrides: Any) -> LocalPlatform:
        config = PlatformConfig(
            data_dir=tmp_path / f"platform-{len(started)}",
            gateway_port=0,
            orchestrators=2,
            nodes=eight_b_nodes(3),
            database_url=migrated_db_url,
            redis_url=redis_url,
            speed=SPEED,
            # The machine's PostgreSQL is shared (max_connections 100): keep the platform's pools small.
            gateway_env={"LLMFLEET_PG_POOL_MIN": "1", "LLMFLEET_PG_POOL_MAX": "8"},
            ready_timeout_s=90.0,
            stop_timeout_s=20.0,
            # Channels `orch:{id}` are shared by every Redis DB: ids of their own (helpers and CI
            # runs side by side on one Redis would hear each other's replicas otherwise).
            orchestrator_id_prefix=f"orch{uuid.uuid4().hex[:6]}",
        )
        for key, value in overrides.items():
            setattr(config, key, value)
        platform = LocalPlatform(config)
        started.append(platform)
        platform.start()
        return platform

    yield factory
    for platform in reversed(started):
        children = [c.popen for c in platform.supervisor.children]
        platform.stop()
        assert all(p.poll() is not None for p in children), "a child survived the platform's stop"
