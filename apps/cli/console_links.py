"""The console's URL and one-time sign-in links that `llmfleet dev` prints (demo team, admin).

Each link carries a short-lived JWT from the dev issuer with a unique `jti`; the console
accepts a link once (it records the token's hash at first use) and redirects at once.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from urllib.parse import quote

from apps.core.identity.local_issuer import LocalIssuer

LINK_TTL_S = 24 * 3600


@dataclass(frozen=True)
class ConsoleLinks:
    url: str
    team: str
    admin: str

    def lines(self, team_name: str) -> list[str]:
        return [
            f"# console: {self.url}",
            f"# console sign-in, team {team_name} (one use): {self.team}",
            f"# console sign-in, admin (one use): {self.admin}",
        ]


def console_links(gateway_url: str, issuer: LocalIssuer, team: str) -> ConsoleLinks:
    def link(token: str) -> str:
        return f"{gateway_url}/console/signin?token={quote(token)}"

    team_token = issuer.mint(f"{team}-user", team=team, ttl_s=LINK_TTL_S, extra={"jti": uuid.uuid4().hex})
    admin_token = issuer.mint("admin", admin=True, ttl_s=LINK_TTL_S, extra={"jti": uuid.uuid4().hex})
    return ConsoleLinks(f"{gateway_url}/console/", link(team_token), link(admin_token))
