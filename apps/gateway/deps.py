"""Everything `create_app` needs, built once by `build_deps` (real) or by tests (fakes)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime

from prometheus_client import CollectorRegistry

from apps.core.clock import SYSTEM
from apps.core.identity.jwt_verify import JwtVerifier
from apps.core.ledger.api import Ledger
from apps.core.ledger.rollups import UsageRollups
from apps.core.spec import StackSpec
from apps.gateway.ports import Dispatcher, Health, Keys, NodeAdmin, QueueBoard, Quota, Resolver, Teams


@dataclass
class GatewayDeps:
    spec: StackSpec
    ledger: Ledger
    teams: Teams
    keys: Keys
    quota: Quota
    dispatcher: Dispatcher
    nodes: NodeAdmin
    health: Health
    resolver: Resolver
    jwt: JwtVerifier | None = None
    usage: UsageRollups | None = None  # the console's rollups (None: the console answers 503)
    board: QueueBoard | None = None  # `GET /admin/queues` (None: it answers 503)
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    clock: Callable[[], datetime] = SYSTEM.now  # apps.core.clock
    # Closed in order at shutdown (pools, clients, sessions).
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
