"""`llmfleet ops audit`: who used which model revision on which node, per request; never content.

`--request-id ID` prints one request (with `--team`, also found by the `x-request-id` its client
chose); `--team T --from --to` every request of a team reserved in
the window, oldest first (at most `--limit`; the line after the table says when more matched). Each
row: the request, when it was reserved, the team, the key (its prefix and name: never the key
itself) or the JWT subject it was admitted under, the model, the model revision and the node that
produced its tokens (recorded by the settle; empty when nothing ran, or for rows settled before
the audit columns existed), the status, prompt / cached / completion tokens and the cost in
credits. The ledger holds counts and money only, so no prompt or completion can be printed.
`--json`: one JSON object per row instead of the table.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import psycopg

from apps.ops.promapi import OpsError

_SELECT = """
SELECT l.request_id, l.created_at, t.name, l.team_id, k.prefix, k.name, l.quota_subject, l.model,
       l.model_revision, l.node_id, l.status::text, l.prompt_tokens, l.cached_prompt_tokens,
       l.completion_tokens, l.resume_prompt_tokens, l.cost_microcredits
FROM usage_ledger l JOIN teams t ON t.id = l.team_id LEFT JOIN api_keys k ON k.id = l.key_id
"""


@dataclass(frozen=True)
class AuditRow:
    request_id: str
    reserved_at: str  # ISO 8601, UTC
    team: str
    team_id: int
    key: str  # `<prefix>… (<name>)`, the JWT subject (`jwt-<sub>`), or "" (none recorded)
    model: str
    revision: str
    node: str
    status: str
    prompt_tokens: int
    cached_prompt_tokens: int
    completion_tokens: int
    resume_prompt_tokens: int  # a resumed stream's second prefill: platform cost, not billed
    cost_credits: str  # exact: microcredits / 1,000,000

    @classmethod
    def of(cls, row: Sequence[Any]) -> AuditRow:
        (rid, created, team, team_id, prefix, key_name, subject, model, revision, node, status,
         prompt, cached, completion, resumed, cost) = row  # fmt: skip
        key = f"{prefix}…" + (f" ({key_name})" if key_name else "") if prefix else str(subject or "")
        assert isinstance(created, dt.datetime)
        return cls(
            request_id=str(rid),
            reserved_at=created.astimezone(dt.UTC).isoformat(timespec="seconds"),
            team=str(team),
            team_id=int(team_id),
            key=key,
            model=str(model),
            revision=str(revision or ""),
            node=str(node or ""),
            status=str(status),
            prompt_tokens=int(prompt),
            cached_prompt_tokens=int(cached),
            completion_tokens=int(completion),
            resume_prompt_tokens=int(resumed),
            cost_credits=f"{int(cost) // 1_000_000}.{int(cost) % 1_000_000:06d}",
        )


def _query(database_url: str, sql: str, params: Sequence[object]) -> list[tuple[Any, ...]]:
    try:
        with psycopg.connect(database_url, connect_timeout=10) as conn:
            return conn.execute(sql, params).fetchall()
    except psycopg.Error as exc:
        raise OpsError(
            f"ledger database not reachable: {str(exc).splitlines()[0]}", param="database_url"
        ) from None


def team_id(database_url: str, team: str) -> int:
    teams = _query(database_url, "SELECT id FROM teams WHERE name = %s OR id::text = %s", [team, team])
    if not teams:
        raise OpsError(f"--team: no team {team!r} (a team's name or id)", param="team")
    return int(teams[0][0])


def by_request(database_url: str, request_id: str, team: str | None = None) -> AuditRow:
    """One request by its ledger id; with `team`, also by the `x-request-id` its client chose (stored
    in the team's namespace, `t<team id>/<id>`: apps/gateway/exchange.py `scoped_request_id`)."""
    ids = [request_id]
    if team is not None:
        ids.append(f"t{team_id(database_url, team)}/{request_id}")
    rows = _query(database_url, _SELECT + " WHERE l.request_id = ANY(%s)", [ids])
    if not rows:
        hint = "" if team is not None else " (an id its client chose is kept per team: add --team)"
        raise OpsError(f"--request-id: no request {request_id!r} in the ledger{hint}", param="request_id")
    return AuditRow.of(rows[0])


def by_team(
    database_url: str, team: str, start: dt.datetime, end: dt.datetime, limit: int
) -> tuple[list[AuditRow], bool]:
    """The team's requests reserved in [start, end), oldest first; True when more than `limit` matched."""
    rows = _query(
        database_url,
        _SELECT + " WHERE l.team_id = %s AND l.created_at >= %s AND l.created_at < %s"
        " ORDER BY l.created_at, l.id LIMIT %s",
        [team_id(database_url, team), start, end, limit + 1],
    )
    return [AuditRow.of(r) for r in rows[:limit]], len(rows) > limit


COLUMNS = (
    ("request_id", "request"),
    ("reserved_at", "reserved (UTC)"),
    ("team", "team"),
    ("key", "key"),
    ("model", "model"),
    ("revision", "revision"),
    ("node", "node"),
    ("status", "status"),
    ("prompt_tokens", "prompt"),
    ("cached_prompt_tokens", "cached"),
    ("completion_tokens", "completion"),
    ("cost_credits", "cost (credits)"),
)


def table(rows: Sequence[AuditRow]) -> str:
    cells = [[title for _, title in COLUMNS]]
    cells += [[str(getattr(r, name)) or "-" for name, _ in COLUMNS] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def json_lines(rows: Sequence[AuditRow]) -> str:
    return "\n".join(json.dumps(asdict(r), ensure_ascii=False) for r in rows)
