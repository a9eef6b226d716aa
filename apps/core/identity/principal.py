"""Who is calling: the verified identity every gateway decision is made from."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from apps.core.quota.admission import Limits
from apps.core.sharing import DEFAULT_WEIGHT, PriorityClass


@dataclass(frozen=True)
class Principal:
    kind: str  # "api_key" | "jwt"
    subject: str  # quota subject: the key id, or "jwt-<sub>"
    team_id: int | None
    team_name: str | None
    key_id: int | None
    model_allowlist: tuple[str, ...]  # empty = every model, unless `models_restricted`
    limits: Limits
    is_admin: bool = False
    expires_at: datetime | None = None
    models_restricted: bool = False  # the allowlist applies even when empty (a JWT `models: []`)
    # Per-key request caps (`api_keys.max_tokens`, `.max_context`; None: the model's own bounds).
    max_tokens: int | None = None
    max_context: int | None = None
    # The sharing model (`apps.core.sharing`): the team's fair-queue weight, the request class.
    team_weight: float = DEFAULT_WEIGHT
    priority_class: PriorityClass = PriorityClass.INTERACTIVE

    def may_use(self, model: str) -> bool:
        if not self.model_allowlist and not self.models_restricted:
            return True
        return model in self.model_allowlist
