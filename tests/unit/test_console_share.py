"""One team's queue share from the fair queue's board rows (`GET /admin/queues` data)."""

from __future__ import annotations

from apps.gateway.console.share import QueueShare, team_shares

BOARD = [
    {
        "model": "m8",
        "replicas": 2,
        "waiting": 10,
        "teams": [
            {"team_id": 1, "served_tokens": 300.0, "classes": [
                {"team_id": 1, "class": "interactive", "waiting": 3, "oldest_wait_s": 1.5},
                {"team_id": 1, "class": "batch", "waiting": 1, "oldest_wait_s": 4.0},
            ]},
            {"team_id": 2, "served_tokens": 100.0, "classes": [
                {"team_id": 2, "class": "interactive", "waiting": 6, "oldest_wait_s": 0.5},
            ]},
        ],
    },
    {"model": "m70", "replicas": 0, "waiting": 0, "teams": []},
]  # fmt: skip


def test_a_teams_waiting_oldest_wait_and_served_share() -> None:
    assert team_shares(BOARD, 1) == [
        QueueShare("m8", waiting=4, waiting_all=10, oldest_wait_s=4.0, served_share=0.75),
        QueueShare("m70", waiting=0, waiting_all=0, oldest_wait_s=0.0, served_share=None),
    ]


def test_a_team_with_nothing_queued_or_served_gets_zeroes_not_an_error() -> None:
    assert team_shares(BOARD, 3)[0] == QueueShare("m8", 0, 10, 0.0, None)
