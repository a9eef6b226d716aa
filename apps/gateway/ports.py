"""The gateway's dependencies as Protocols (fakes live in `tests/fakes`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from datetime import date, datetime
from typing import Any, Protocol

from apps.core.guardrails.counts import DecisionCount
from apps.core.guardrails.decisions import Decision
from apps.core.identity.keys import KeyRecord
from apps.core.identity.principal import Principal
from apps.core.ledger.teams import Team
from apps.core.protocol.dispatch import DispatchRequest
from apps.core.quota.admission import Admission, Limits
from apps.core.quota.refusals import RefusalCount
from apps.core.sharing import PriorityClass
from apps.gateway.slo import SloStatus


class Upstream(Protocol):
    """One dispatched request: status and headers known, body streaming."""

    status: int
    headers: Mapping[str, str]

    def chunks(self) -> AsyncIterator[bytes]: ...

    async def read_body(self) -> bytes: ...

    async def aclose(self) -> None:
        """Close the connection; the orchestrator then cancels the request on the node."""
        ...


class WrappedUpstream:
    """An upstream whose chunks a gateway layer rewrites (the guardrails' output checks, the response
    cache's capture): the status, the headers, a body read and the close are the inner upstream's."""

    def __init__(self, inner: Upstream) -> None:
        self._inner = inner
        self.status: int = inner.status
        self.headers: Mapping[str, str] = inner.headers

    def chunks(self) -> AsyncIterator[bytes]:
        return self._inner.chunks()

    async def read_body(self) -> bytes:
        return await self._inner.read_body()

    async def aclose(self) -> None:
        await self._inner.aclose()


class DispatchUnavailable(Exception):
    """No orchestrator replica could be reached: nothing ran."""


class Dispatcher(Protocol):
    async def open(self, request: DispatchRequest) -> Upstream:
        """Returns once the orchestrator answered with a status; raises `DispatchUnavailable`."""
        ...

    async def aclose(self) -> None: ...


class Refusals(Protocol):
    """Refused requests per team and day (`apps.core.quota.refusals.RefusalStore`)."""

    async def count(self, team_id: int, key_id: int | None, status: int, reason: str) -> None: ...

    async def recent(self, team_id: int, key_id: int | None = None) -> list[RefusalCount]: ...


class GuardrailCounts(Protocol):
    """Guardrail decisions per team and UTC day (`apps.core.guardrails.counts.DecisionCounts`)."""

    async def count(self, team_id: int, decisions: Iterable[Decision]) -> None: ...

    async def team(self, team_id: int, start: date, end_exclusive: date) -> list[DecisionCount]: ...

    async def teams(self, start: date, end_exclusive: date) -> list[DecisionCount]: ...

    def kept_since(self) -> date: ...


class SloSource(Protocol):
    """The admin view's SLO status (`apps.gateway.slo.PrometheusSlo`)."""

    async def status(self) -> SloStatus: ...


class NodeAdmin(Protocol):
    async def issue_token(
        self, node_id: str, location: str, *, pool: bool = False, models: Sequence[str] | None = None
    ) -> str: ...

    async def revoke(self, node_id: str) -> bool: ...

    async def list_nodes(self) -> list[dict[str, object]]: ...

    async def request_drain(self, node_id: str) -> bool:
        """Ask the orchestrator owning the node's socket to drain it; False if none owns it."""
        ...


class Resolver(Protocol):
    async def resolve(self, host: str) -> list[str]:
        """IP addresses of a hostname; raises OSError when it does not resolve."""
        ...


class Health(Protocol):
    async def postgres_ok(self) -> bool: ...

    async def redis_ok(self) -> bool: ...


class Quota(Protocol):
    """Admission (`apps.core.quota.admission.QuotaStore`); `StoreUnavailable` when Redis fails."""

    async def admit(
        self, subject: str, request_id: str, limits: Limits, now: datetime, worst_case_tokens: int = 0
    ) -> Admission: ...

    async def release(
        self, subject: str, request_id: str, *, forget_tokens: bool = False, team_id: int | None = None
    ) -> None: ...


class Keys(Protocol):
    """API keys (`apps.core.identity.keys.KeyStore`)."""

    async def authenticate(self, secret: str) -> Principal: ...

    async def create(
        self,
        *,
        team: str | int,
        model_allowlist: Sequence[str] = (),
        rpm: int | None = None,
        tokens_per_day: int | None = None,
        max_streams: int | None = None,
        expires_at: datetime | None = None,
        name: str | None = None,
        max_tokens: int | None = None,
        max_context: int | None = None,
        priority_class: PriorityClass = PriorityClass.INTERACTIVE,
    ) -> tuple[str, KeyRecord]: ...

    async def list_keys(self, team: str | int | None = None) -> list[KeyRecord]: ...

    async def update(self, key_id: int, changes: dict[str, int | None]) -> KeyRecord: ...

    async def revoke(self, key_id: int) -> bool: ...


class Teams(Protocol):
    """Teams and credits (`apps.core.ledger.teams.TeamStore`)."""

    async def create_team(
        self,
        name: str,
        weight: float = 1.0,
        credits_microcredits: int = 0,
        priority_classes: tuple[PriorityClass, ...] = ...,
    ) -> Team: ...

    async def set_sharing(
        self,
        ref: str | int,
        *,
        weight: float | None = None,
        max_streams: int | None = ...,
        tokens_per_minute: int | None = ...,
        priority_classes: tuple[PriorityClass, ...] | None = None,
    ) -> Team: ...

    async def list_teams(self) -> list[Team]: ...

    async def get_team(self, ref: str | int) -> Team: ...

    async def add_credits(
        self, team: str | int, amount_microcredits: int, reason: str = "admin"
    ) -> dict[str, Any]: ...

    async def usage(
        self, team_id: int, start: datetime, end: datetime, *, by_day: bool = False
    ) -> list[dict[str, Any]]: ...


class QueueBoard(Protocol):
    """The orchestrators' fair queues as Redis holds them (`apps.core.fairboard.RedisQueueBoard`)."""

    async def read(self, models: Iterable[str]) -> list[dict[str, Any]]: ...
