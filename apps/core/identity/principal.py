"""Who is calling: the verified identity every gateway decision is made from."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from apps.core.quota.admission import Limits


@dataclass(frozen=True)
class Principal:
    kind: str  # "api_key" | "jwt"
    subject: str  # quota subject: the key id, or "jwt-<sub>"
    team_id: int | None
    team_name: str | None
    key_id: int | None
    model_allowlist: tuple[str, ...]  # empty = every model
    limits: Limits
    is_admin: bool = False
    expires_at: datetime | None = None

    def may_use(self, model: str) -> bool:
        return not self.model_allowlist or model in self.model_allowlist
