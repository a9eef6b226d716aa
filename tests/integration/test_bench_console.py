"""`python -m tools.bench console` end to end on a small ledger (real PostgreSQL and Redis): it signs in as a
browser does and renders the full-year team page. Its timings are not checked (never a timing threshold in a
test); that it runs is (it once failed on the sign-in form's CSRF token, unnoticed until a benchmark run)."""

from __future__ import annotations

import json

import pytest

from tools.bench import console

pytestmark = pytest.mark.timeout(120)


def test_the_console_benchmark_runs_on_a_small_ledger(
    pg_admin_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LLMFLEET_REDIS_URL", redis_url)  # the gateway's settings read it
    console.main(["--rows", "3000", "--repeat", "2", "--pg-url", pg_admin_url])
    result = json.loads(capsys.readouterr().out)
    assert result["rows"] == 3000
    assert result["rollup_rows"] > 0
    assert result["page_bytes"] > 0
    for part in ("page_full_year", "raw_ledger_query_full_year"):
        assert set(result[part]) == {"median_ms", "p95_ms", "max_ms"}
    assert set(result["settle_us_per_row"]) == {"trigger_on", "trigger_off"}
