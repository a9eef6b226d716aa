"""Everything `create_app` needs, built once by `build_deps` (real) or by tests (fakes)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime

from prometheus_client import CollectorRegistry

from apps.core.clock import SYSTEM
from apps.core.guardrails.api import GuardrailPolicies
from apps.core.identity.console_sessions import ConsoleSessions
from apps.core.identity.jwt_verify import JwtVerifier
from apps.core.ledger.api import Ledger
from apps.core.ledger.rollups import UsageRollups
from apps.core.respcache.policies import CachePolicyStore
from apps.core.respcache.store import CacheStore
from apps.core.spec import StackSpec
from apps.gateway.ports import (
    Dispatcher,
    GuardrailCounts,
    Health,
    Keys,
    NodeAdmin,
    QueueBoard,
    Quota,
    Refusals,
    Resolver,
    SloSource,
    Teams,
)


@dataclass
class Lifecycle:
    """Set once the process was told to stop (SIGTERM): `/readyz` answers 503 and new chat
    requests are refused while the streams in flight finish (apps/gateway/cli.py)."""

    stopping: bool = False


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
    sessions: ConsoleSessions | None = None  # console sessions (None: the console answers 503)
    refusals: Refusals | None = None  # 429s and 503s per team and day, for the console
    guardrail_counts: GuardrailCounts | None = (
        None  # guardrail decisions per team and day (None: not counted)
    )
    slo: SloSource | None = None  # the admin view's SLO status (None: Prometheus not configured)
    board: QueueBoard | None = None  # `GET /admin/queues` (None: it answers 503)
    guardrails: GuardrailPolicies | None = None  # team guardrail policies (None: no checks, admin routes 503)
    cache_policies: CachePolicyStore | None = (
        None  # response cache policies (None: no cache, admin routes 503)
    )
    cache_store: CacheStore | None = None  # the response cache's entries (with `cache_policies`)
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    clock: Callable[[], datetime] = SYSTEM.now  # apps.core.clock
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    # Closed in order at shutdown (pools, clients, sessions).
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
