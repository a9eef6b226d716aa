"""The contract of team guardrail policies, as the gateway uses them (`GuardrailPolicies`; PostgreSQL
implementation in `store`): the admin routes save and read a policy, the request path reads it compiled."""

from __future__ import annotations

from typing import Protocol

from apps.core.guardrails.policy import CompiledPolicy, GuardrailPolicy
from apps.core.teamdocs import StoredDocument

StoredPolicy = StoredDocument[GuardrailPolicy]


class GuardrailPolicies(Protocol):
    async def get(self, team_id: int) -> StoredPolicy | None:
        """The team's policy (None: it has none); `NotFound` for a team that does not exist."""
        ...

    async def put(self, team_id: int, policy: GuardrailPolicy) -> StoredPolicy:
        """Save (replace) the team's policy; `NotFound` for a team that does not exist."""
        ...

    async def delete(self, team_id: int) -> bool:
        """Remove the team's policy (False: it had none); `NotFound` for a team that does not exist."""
        ...

    async def compiled(self, team_id: int) -> CompiledPolicy | None:
        """The team's policy compiled, for the request path (None: no guardrails); may be cached."""
        ...
