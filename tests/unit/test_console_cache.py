"""The console's response cache panel from rollup rows (`UsageRollups.cache_use`): folding, hit rate,
GPU time at the planning figure, and how GPU time reads."""

from __future__ import annotations

from datetime import date

import pytest

from apps.core.ledger.rollups import CacheUse
from apps.gateway.console.cache import CacheLine, gpu_time, panel

DAY = date(2026, 12, 1)
PER_TOKEN = {"m8": 1 / 1500, "m70": 4 / 300}  # GPU seconds per completion token (the gateway's figure)


def test_per_model_lines_their_rates_gpu_time_and_total() -> None:
    rows = [
        CacheUse(1, "m8", hits=3, misses=1, hit_completion_tokens=1500, hit_cost_microcredits=40),
        CacheUse(1, "m70", hits=0, misses=2, hit_completion_tokens=0, hit_cost_microcredits=0),
        CacheUse(1, "bge", 0, 0, 0, 0, lookups=5, lookup_cost_microcredits=7),
    ]
    p = panel("Model", rows, DAY, DAY, PER_TOKEN, lambda r: (r.model, r.model))
    assert [line.key for line in p.lines] == ["bge", "m70", "m8"]
    m8, m70, bge = p.lines[2], p.lines[1], p.lines[0]
    assert m8.hit_rate == 0.75
    assert m8.gpu_seconds == pytest.approx(1.0)  # 1,500 tokens at 1/1,500 GPU-s each
    assert m70.hit_rate == 0.0
    assert bge.hit_rate is None  # the cache was never asked about the embedding model itself
    assert bge.gpu_seconds == 0.0  # no planning figure: nothing claimed
    total = p.total
    assert (total.hits, total.misses, total.lookups, total.lookup_microcredits) == (3, 3, 5, 7)
    assert total.hit_rate == 0.5
    assert total.gpu_seconds == pytest.approx(1.0)


def test_per_team_lines_fold_models_and_name_unknown_teams_by_id() -> None:
    rows = [
        CacheUse(1, "m8", 1, 0, 300, 10),
        CacheUse(1, "m70", 1, 1, 30, 20),
        CacheUse(2, "m8", 0, 4, 0, 0),
    ]
    names = {1: "alpha"}
    p = panel(
        "Team",
        rows,
        DAY,
        DAY,
        PER_TOKEN,
        lambda r: (str(r.team_id), names.get(r.team_id, f"team {r.team_id}")),
    )
    alpha, other = p.lines
    assert (alpha.key, alpha.label, alpha.hits, alpha.misses, alpha.hit_microcredits) == (
        "1",
        "alpha",
        2,
        1,
        30,
    )
    assert alpha.gpu_seconds == pytest.approx(300 / 1500 + 30 * 4 / 300)
    assert (other.label, other.hit_rate) == ("team 2", 0.0)


def test_an_empty_panel_has_a_zero_total() -> None:
    p = panel("Model", [], DAY, DAY, PER_TOKEN, lambda r: (r.model, r.model))
    assert p.lines == []
    assert p.total == CacheLine("total", "Total")
    assert p.total.hit_rate is None


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0.0, "0 GPU-s"),
        (0.00266667, "0.00267 GPU-s"),
        (42.0, "42 GPU-s"),
        (119.0, "119 GPU-s"),
        (120.0, "2 GPU-min"),
        (5400.0, "90 GPU-min"),
        (7200.0, "2 GPU-h"),
        (3600.0 * 12_345.4, "12,345 GPU-h"),
    ],
)
def test_gpu_time_reads_in_seconds_minutes_or_hours(seconds: float, shown: str) -> None:
    assert gpu_time(seconds) == shown
