"""In-memory stand-ins for the gateway's store Protocols (`apps.gateway.ports`): unit tests of the
chat handler without PostgreSQL or Redis. Each records what it was asked."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import date, datetime
from typing import Any

from apps.core.errors import AuthenticationFailed, LlmfleetError, NotFound
from apps.core.guardrails.counts import DecisionCount
from apps.core.guardrails.decisions import Decision
from apps.core.identity.keys import KeyRecord
from apps.core.identity.principal import Principal
from apps.core.ledger.teams import Team
from apps.core.quota.admission import Admission, Limits, Verdict
from apps.core.quota.refusals import RefusalCount
from apps.core.sharing import ALL_CLASSES, PriorityClass


@dataclass
class FakeQuota:
    verdict: Verdict = Verdict.ADMITTED
    fail: LlmfleetError | None = None  # raised by `admit` (e.g. `StoreUnavailable("redis")`)
    held: set[str] = field(default_factory=set)
    released: list[str] = field(default_factory=list)

    async def admit(
        self, subject: str, request_id: str, limits: Limits, now: datetime, worst_case_tokens: int = 0
    ) -> Admission:
        if self.fail is not None:
            raise self.fail
        if self.verdict is Verdict.ADMITTED:
            self.held.add(request_id)
        return Admission(
            self.verdict, limits, len(self.held), 7.0 if self.verdict else 0.0, 1, 60.0, 0, 3600.0
        )

    async def release(
        self, subject: str, request_id: str, *, forget_tokens: bool = False, team_id: int | None = None
    ) -> None:
        self.held.discard(request_id)
        self.released.append(request_id)


@dataclass
class FakeKeys:
    principals: dict[str, Principal] = field(default_factory=dict)

    def add(self, secret: str, team_id: int = 1, limits: Limits | None = None) -> Principal:
        principal = Principal(
            "api_key", f"key-{len(self.principals) + 1}", team_id, "t", 1, (), limits or Limits()
        )
        self.principals[secret] = principal
        return principal

    async def authenticate(self, secret: str) -> Principal:
        if secret not in self.principals:
            raise AuthenticationFailed("Incorrect API key provided.")
        return self.principals[secret]

    async def create(self, **options: Any) -> tuple[str, KeyRecord]:
        raise NotImplementedError("admin routes are tested against PostgreSQL")

    async def list_keys(self, team: str | int | None = None) -> list[KeyRecord]:
        return []

    async def update(self, key_id: int, changes: dict[str, int | None]) -> KeyRecord:
        raise NotImplementedError("admin routes are tested against PostgreSQL")

    async def revoke(self, key_id: int) -> bool:
        return False


@dataclass
class FakeTeams:
    teams: dict[int, Team] = field(default_factory=dict)

    async def create_team(
        self,
        name: str,
        weight: float = 1.0,
        credits_microcredits: int = 0,
        priority_classes: tuple[PriorityClass, ...] = ALL_CLASSES,
    ) -> Team:
        team = Team(
            len(self.teams) + 1, name, credits_microcredits, weight, priority_classes=priority_classes
        )
        self.teams[team.id] = team
        return team

    async def set_sharing(
        self,
        ref: str | int,
        *,
        weight: float | None = None,
        priority_classes: tuple[PriorityClass, ...] | None = None,
        **limits: Any,
    ) -> Team:
        team = await self.get_team(ref)
        team = replace(team, weight=team.weight if weight is None else weight, **limits)
        if priority_classes is not None:
            team = replace(team, priority_classes=priority_classes)
        self.teams[team.id] = team
        return team

    async def list_teams(self) -> list[Team]:
        return list(self.teams.values())

    async def get_team(self, ref: str | int) -> Team:
        for team in self.teams.values():
            if ref in (team.id, team.name, str(team.id)):
                return team
        raise NotFound(f"no team {ref!r}", param="team")

    async def add_credits(
        self, team: str | int, amount_microcredits: int, reason: str = "admin"
    ) -> dict[str, Any]:
        raise NotImplementedError("credits are tested against PostgreSQL")

    async def usage(
        self, team_id: int, start: datetime, end: datetime, *, by_day: bool = False
    ) -> list[dict[str, Any]]:
        return []


class StaticHealth:
    async def postgres_ok(self) -> bool:
        return True

    async def redis_ok(self) -> bool:
        return True


@dataclass
class FakeRefusals:
    """`apps.gateway.ports.Refusals` in memory; `fail` is raised by `count`."""

    counted: list[tuple[int, int | None, int, str]] = field(default_factory=list)
    fail: LlmfleetError | None = None

    async def count(self, team_id: int, key_id: int | None, status: int, reason: str) -> None:
        if self.fail is not None:
            raise self.fail
        self.counted.append((team_id, key_id, status, reason))

    async def recent(self, team_id: int, key_id: int | None = None) -> list[RefusalCount]:
        pairs: dict[tuple[int, str], int] = {}
        for team, key, status, reason in self.counted:
            if team == team_id and (key_id is None or key == key_id):
                pairs[status, reason] = pairs.get((status, reason), 0) + 1
        return [RefusalCount(s, r, n, n) for (s, r), n in sorted(pairs.items())]


@dataclass
class FakeGuardrailCounts:
    """`apps.gateway.ports.GuardrailCounts` in memory: each `count` call is one batch in `batches`;
    `fail` is raised by `count`, and `hang` makes it wait until it is cancelled (a Redis that does not
    answer)."""

    batches: list[tuple[int, list[Decision]]] = field(default_factory=list)
    fail: LlmfleetError | None = None
    hang: bool = False

    async def count(self, team_id: int, decisions: Iterable[Decision]) -> None:
        if self.fail is not None:
            raise self.fail
        if self.hang:
            await asyncio.Event().wait()  # never set: only a cancellation ends it
        self.batches.append((team_id, list(decisions)))

    async def team(self, team_id: int, start: date, end_exclusive: date) -> list[DecisionCount]:
        return [c for c in await self.teams(start, end_exclusive) if c.team_id == team_id]

    async def teams(self, start: date, end_exclusive: date) -> list[DecisionCount]:
        tally: dict[tuple[int, str, str, str], int] = {}
        for team, batch in self.batches:
            for d in batch:
                tally[team, d.direction, d.check, d.action] = (
                    tally.get((team, d.direction, d.check, d.action), 0) + 1
                )
        return [DecisionCount(dr, ck, ac, n, t) for (t, dr, ck, ac), n in sorted(tally.items())]

    def kept_since(self) -> date:
        return date.min
