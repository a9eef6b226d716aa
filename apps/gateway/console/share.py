"""A team's share of the fair queue, per model, for the team view (issue 19's board, one team's rows).

From `GET /admin/queues`'s data (`apps.core.fairboard.read_board`): what the team has waiting now on
every live orchestrator replica against everybody's, its oldest wait, and its share of the tokens
the fair queue charged over the counters' life (a day without traffic resets them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class QueueShare:
    model: str
    waiting: int  # this team's requests waiting now (both classes)
    waiting_all: int  # every team's
    oldest_wait_s: float
    served_share: float | None  # this team's share of the served tokens; None: nothing served yet


def team_shares(board: list[dict[str, Any]], team_id: int) -> list[QueueShare]:
    out: list[QueueShare] = []
    for row in board:
        teams = row.get("teams", [])
        mine = next((t for t in teams if t.get("team_id") == team_id), None)
        served_all = sum(float(t.get("served_tokens", 0.0)) for t in teams)
        classes = mine.get("classes", []) if mine else []
        out.append(
            QueueShare(
                model=str(row["model"]),
                waiting=sum(int(c.get("waiting", 0)) for c in classes),
                waiting_all=int(row.get("waiting", 0)),
                oldest_wait_s=max((float(c.get("oldest_wait_s", 0.0)) for c in classes), default=0.0),
                served_share=(float(mine.get("served_tokens", 0.0)) / served_all)
                if mine and served_all > 0
                else None,
            )
        )
    return out
