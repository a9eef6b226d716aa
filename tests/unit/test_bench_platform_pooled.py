"""`python -m tools.bench platform --repeat` (`tools/bench/platform_report.py`): the pooled row takes its percentiles over every run's samples."""

from __future__ import annotations

from typing import Any

import pytest

from tools.bench import platform_report as bp


def _report(ttfts: list[float], transits: list[float], tokens: int, errors: int = 0) -> dict[str, Any]:
    return {
        "ttft_ms": {"p50": None, "p99": None},  # per-run figures are not what the pooled row uses
        "transit_ms": {"ok": len(transits), "joined": len(transits), "p50": None, "p99": None},
        "output_tokens": tokens,
        "requests": {"ok": len(ttfts), "error": errors},
        "errors_by_status": {"503": errors} if errors else {},
        bp.TTFT_SAMPLES: ttfts,
        bp.TRANSIT_SAMPLES: transits,
    }


def test_pooled_percentiles_are_over_all_samples_not_an_average_of_runs() -> None:
    pairs = [
        (
            bp.Run("direct", 2, _report([0.100, 0.200], [0.001, 0.002], 0), "steady", "1"),
            bp.Run("platform", 2, _report([0.110, 0.210], [0.010, 0.020], 128), "steady", "1", cpu_s=1.0),
        ),
        (
            bp.Run("direct", 2, _report([0.300, 0.400], [0.003, 0.004], 0), "steady", "2"),
            bp.Run("platform", 2, _report([0.900, 0.910], [0.030, 0.040], 128, 1), "steady", "2", cpu_s=2.0),
        ),
    ]
    direct, via = bp.pooled(pairs)
    assert (direct.label, via.label) == ("pooled", "pooled")
    # Median of the four platform TTFTs (0.11, 0.21, 0.90, 0.91) is 0.555 s; the mean of the two
    # runs' medians would be 0.5325 s.
    assert via.report["ttft_ms"]["p50"] == pytest.approx(555.0)
    assert direct.report["ttft_ms"]["p50"] == pytest.approx(250.0)
    assert via.report["transit_ms"]["p50"] == pytest.approx(25.0)
    assert via.report["transit_ms"]["joined"] == 4
    assert via.tokens == 256
    assert via.cpu_s == 3.0
    assert via.report["requests"] == {"ok": 4, "error": 1}
    assert via.report["errors_by_status"] == {"503": 1}
    row = bp.row(direct, via)
    assert row.startswith("| pooled | 2 | steady | 250.0 / ")
    assert "**305.0 / " in row  # added p50 = 555 - 250
