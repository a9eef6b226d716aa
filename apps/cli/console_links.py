"""The console's URL and one-time sign-in links that `llmfleet dev` prints (demo team, admin).

Each link carries a JWT from the dev issuer valid for 15 minutes with a unique `jti`, in the URL
fragment (`/console/signin#token=...`): browsers never send a fragment, so the token reaches no
server log; the sign-in page's script posts it through the form. The console accepts a `jti` once.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from urllib.parse import quote

from apps.core.identity.local_issuer import LocalIssuer

LINK_TTL_S = 15 * 60


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
        return f"{gateway_url}/console/signin#token={quote(token)}"

    team_token = issuer.mint(f"{team}-user", team=team, ttl_s=LINK_TTL_S, extra={"jti": uuid.uuid4().hex})
    admin_token = issuer.mint("admin", admin=True, ttl_s=LINK_TTL_S, extra={"jti": uuid.uuid4().hex})
    return ConsoleLinks(f"{gateway_url}/console/", link(team_token), link(admin_token))
