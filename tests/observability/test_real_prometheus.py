"""A real Prometheus scraping a loaded local platform: every recording rule and dashboard query
returns data, Prometheus agrees with loadgen and the ledger, every KEDA query of the rendered
prod stack returns exactly one series, and the two ops jobs run against it."""

from __future__ import annotations

import asyncio
import datetime as dt
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from apps.cli.platform import DEMO_TEAM, MODEL_8B, LocalPlatform, PlatformConfig, dev_nodes
from apps.cli.prometheus import LocalPrometheus
from apps.core.ledger.rollups import UsageRollups
from apps.core.sizing.plan import plan_fleet
from apps.core.spec import load_spec
from apps.gateway.caching import gpu_seconds_per_token
from apps.gateway.console.cache import panel
from apps.gateway.slo import PrometheusSlo, SloStatus
from apps.ops.drift import measure
from apps.ops.promapi import Prometheus
from apps.ops.window import iso_week
from infra.config import OfficeHours
from infra.manifests.alerts import recording_rules
from infra.manifests.dashboards import dashboards, panel_queries
from tests.chaos.helpers import ledger_totals, wait_until
from tests.conftest import platform_stores
from tests.observability.cache_traffic import cache_traffic
from tests.observability.stage import (
    MAX_STREAMS,
    TTFT_COUNT,
    Stage,
    load,
    query,
    serve_cluster_page,
    wait_scraped,
)

pytestmark = [pytest.mark.prometheus, pytest.mark.timeout(420)]


@pytest.fixture(scope="module")
def stage(
    pg_admin_url: str, redis_base_url: str, redis_test_db: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stage]:
    with platform_stores(pg_admin_url, redis_base_url, redis_test_db, "llmfleet_obs") as (db_url, redis_url):
        yield from _platform(db_url, redis_url, tmp_path_factory)


def _platform(db_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stage]:
    cluster = serve_cluster_page()
    tag = uuid.uuid4().hex[:6]  # pub/sub channels are shared by every Redis DB: unique node ids
    nodes = [type(n)(f"{n.node_id}-{tag}", n.model, n.location) for n in dev_nodes()]
    config = PlatformConfig(
        data_dir=tmp_path_factory.mktemp("obs"),
        gateway_port=0,
        orchestrators=2,
        nodes=nodes,
        database_url=db_url,
        redis_url=redis_url,
        gateway_env={"LLMFLEET_PG_POOL_MIN": "1", "LLMFLEET_PG_POOL_MAX": "6"},
        ready_timeout_s=90.0,
        demo_key={"max_streams": MAX_STREAMS},
    )
    platform = LocalPlatform(config)
    try:
        platform.start()
        prom = LocalPrometheus(
            platform,
            scrape_interval_s=1.0,
            engine_scrape_interval_s=0.5,
            extra_targets={"cluster": [(f"127.0.0.1:{cluster.server_address[1]}", {})]},
        )
        prom.start()
        started = dt.datetime.now(dt.UTC).timestamp()
        reports, steady_at = asyncio.run(load(platform, prom))
        cache = cache_traffic(platform, prom.url)
        wait_until(lambda: ledger_totals(db_url).reserved == 0, 60, "every reservation settled or cancelled")
        wait_scraped(prom.url, platform)
        # The burst's refusal series appear at the end of the load: wait until Prometheus holds two
        # samples of them and the rule group has evaluated (rate() needs two).
        wait_until(lambda: query(prom.url, "llmfleet:refusals:rate5m"), 60, "the refusal rule has data")
        ended = dt.datetime.now(dt.UTC).timestamp()
        yield Stage(platform, prom, db_url, started, ended, reports, steady_at, cache)
    finally:
        platform.stop()
        cluster.shutdown()
        cluster.server_close()


def _substitute(expr: str) -> str:
    subs = {"$model": ".*", "$team": ".*", "$__rate_interval": "1m", "$__range": "1h"}
    for variable, value in subs.items():
        expr = expr.replace(variable, value)
    return expr


def test_the_load_ran_with_disconnects_and_a_killed_engine(stage: Stage) -> None:
    reports = {k: r.to_json() for k, r in stage.reports.items()}
    for k, r in reports.items():
        print(
            k,
            r["requests"],
            r["errors_by_status"],
            "ttft_ms",
            r["ttft_ms"],
            "tok/s",
            r["output_tokens_per_s"],
        )
    assert reports["8b"]["requests"]["ok"] > 50
    assert reports["abandon"]["requests"]["abandoned"] >= 20  # a few may fail before their 5th chunk
    assert reports["70b"]["requests"]["ok"] > 0
    assert reports["burst"]["errors_by_status"].get("429", 0) > 0


def test_every_recording_rule_and_dashboard_query_returns_data(stage: Stage) -> None:
    spec = load_spec("dev")
    empty = []
    for rule in recording_rules(spec, plan_fleet(spec), OfficeHours()):
        if not query(stage.url, rule["record"]):
            empty.append(f"record {rule['record']}")
    for board in dashboards(spec).values():
        for title, expr in panel_queries(board):
            if not query(stage.url, _substitute(expr)):
                empty.append(f"{board['title']} / {title}: {expr}")
    assert not empty, "no data:\n" + "\n".join(empty)


def test_ttft_p95_from_prometheus_within_20_percent_of_loadgen(stage: Stage) -> None:
    """The same requests on both sides: every 8B request of the steady runs (the abandoned ones too),
    read from the gateway's cumulative histogram at the instant Prometheus held the last of them and
    before the burst began (a p95 over the steady and the burst populations together falls between
    the two modes, where one request more or less moves it by a bucket)."""
    expr = (
        f'histogram_quantile(0.95, sum by (le) (llmfleet_gateway_ttft_seconds_bucket{{model="{MODEL_8B}"}}))'
    )
    prom_p95 = float(query(stage.url, expr, stage.steady_at)[0]["value"][1])
    results = [*stage.reports["8b"].results, *stage.reports["abandon"].results]
    ttfts = sorted(r.ttft_s for r in results if r.ttft_s is not None)
    client_p95 = ttfts[int(0.95 * (len(ttfts) - 1))]
    count = float(query(stage.url, TTFT_COUNT, stage.steady_at)[0]["value"][1])
    print(f"TTFT p95: Prometheus {prom_p95 * 1000:.1f} ms, loadgen {client_p95 * 1000:.1f} ms")
    assert count == len(ttfts)  # the same population: one observation per client-seen first token
    assert abs(prom_p95 - client_p95) <= 0.2 * client_p95


def test_the_consoles_slo_status_reads_the_rules_on_the_real_prometheus(stage: Stage) -> None:
    slo = PrometheusSlo(stage.url, load_spec("dev"), timeout_s=10.0)

    async def read() -> SloStatus:
        try:
            return await slo.status()
        finally:
            await slo.aclose()

    status = asyncio.run(read())
    assert status.error is None
    titles = {r.indicator.title for r in status.models if r.labels.get("model") == MODEL_8B and r.value}
    assert titles == {"TTFT p50", "TTFT p95", "tokens/s per stream, p05", "queue wait p95"}
    with psycopg.connect(stage.database_url, autocommit=True) as conn:
        row = conn.execute("SELECT id FROM teams WHERE name = %s", (DEMO_TEAM,)).fetchone()
    assert row is not None
    demo = [  # metrics label a team by its id (issue 27)
        r for r in status.teams if r.labels.get("team") == str(row[0]) and r.labels.get("model") == MODEL_8B
    ]
    assert demo
    assert demo[0].value is not None
    assert 0 <= demo[0].value <= 1


def test_engine_tokens_in_prometheus_equal_the_ledger(stage: Stage) -> None:
    """Where every stream ran to its end (the 32B model) the counts are equal to the token. Where
    clients left or an engine died, the engines produced tokens nobody received (the agent bills
    the chunks it relayed after an abort): the gap is at most those streams' unreceived tokens."""
    start = dt.datetime.fromtimestamp(stage.started - 60, dt.UTC)
    end = dt.datetime.fromtimestamp(stage.ended + 1, dt.UTC)
    prom = Prometheus(stage.url)
    drift = measure(prom, stage.database_url, start, end, None)
    totals = ledger_totals(stage.database_url)
    print(f"ledger {drift.ledger_tokens} engines {drift.engine_tokens:.0f} drift {drift.ratio:.5%}")
    for model in load_spec("dev").models:
        m = measure(prom, stage.database_url, start, end, model)
        print(
            f"  {model}: ledger {m.ledger_tokens} engines {m.engine_tokens:.0f} ({m.ledger_requests} settled)"
        )
    # The response cache's hits are billed tokens no engine generated: the drift job leaves them out.
    assert drift.ledger_tokens == totals.completion_tokens - _cache_hits(stage.database_url)[1]
    assert drift.replicas == 6  # five engines (bge-m3 counts its zero generated tokens) and the restarted 70B
    steady = measure(prom, stage.database_url, start, end, "qwen2.5-32b-instruct")
    assert steady.ledger_tokens > 0
    assert steady.engine_tokens == steady.ledger_tokens
    unreceived = sum(
        stage.reports[name].config.max_tokens - r.token_chunks
        for name in stage.reports
        for r in stage.reports[name].results
        if r.outcome.value != "ok"
    )
    assert abs(drift.engine_tokens - drift.ledger_tokens) <= unreceived
    assert drift.ratio < 0.001  # the brief's threshold, with the disconnects and the killed engine


def _cache_hits(database_url: str) -> tuple[int, int]:
    """(hits, their completion tokens) in the ledger."""
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT count(*), COALESCE(SUM(completion_tokens), 0) FROM usage_ledger"
            " WHERE status = 'settled' AND cache = 'hit'"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _value(stage: Stage, expr: str) -> float:
    result = query(stage.url, expr)
    assert len(result) == 1, (expr, result)
    return float(result[0]["value"][1])


def test_the_cache_panels_read_the_stages_hits_and_the_console_agrees(stage: Stage) -> None:
    """The stage's hits and misses as the dashboards read them, against the ledger; and the console's
    GPU time saved (the ledger's hit tokens at the planning figure) equal to the gateway's counter."""
    spec = load_spec("dev")
    traffic = stage.cache
    hits, hit_tokens = _cache_hits(stage.database_url)
    assert hits == traffic.hits
    team = f'team="{traffic.team_id}",model="{MODEL_8B}"'
    requests = "llmfleet_gateway_cache_requests_total"
    assert _value(stage, f'sum({requests}{{{team},result="exact_hit"}})') == traffic.hits
    assert _value(stage, f'sum({requests}{{{team},result="miss"}})') == traffic.misses
    saved = _value(stage, f"sum(llmfleet_gateway_cache_saved_gpu_seconds_total{{{team}}})")
    assert saved == pytest.approx(hit_tokens * gpu_seconds_per_token(spec)[MODEL_8B])

    async def console_gpu_seconds() -> float:
        async with AsyncConnectionPool(stage.database_url, min_size=1, max_size=1) as pool:
            today = dt.datetime.now(dt.UTC).date()
            rows = await UsageRollups(pool).cache_use(
                traffic.team_id, today - dt.timedelta(days=1), today + dt.timedelta(days=1)
            )
        return panel(
            "Model", rows, today, today, gpu_seconds_per_token(spec), lambda r: (r.model, r.model)
        ).total.gpu_seconds

    assert asyncio.run(console_gpu_seconds()) == pytest.approx(saved)
    boards = dashboards(spec)
    panels = {title: expr for board in boards.values() for title, expr in panel_queries(board)}
    rate = query(stage.url, _substitute(panels["Response cache hit rate per model"]))
    by_model = {r["metric"]["model"]: float(r["value"][1]) for r in rate}
    assert 0 < by_model[MODEL_8B] <= 1, rate  # hits and misses both moved in the last 5 minutes
    assert _value(stage, _substitute(panels["GPU hours saved by the response cache (time range)"])) > 0
    lookup = query(stage.url, _substitute(panels["Response cache lookup p95 on misses"]))
    assert {(r["metric"]["model"], r["metric"]["match"]) for r in lookup} == {(MODEL_8B, "exact")}
    assert all(0 < float(r["value"][1]) < 5 for r in lookup), lookup


def _ops(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "apps.cli.main", "ops", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        check=False,
    )


def _window(stage: Stage) -> list[str]:
    start = dt.datetime.fromtimestamp(stage.started - 60, dt.UTC).isoformat()
    end = dt.datetime.fromtimestamp(stage.ended + 1, dt.UTC).isoformat()
    return ["--from", start, "--to", end]


def test_ops_drift_passes_then_reports_an_injected_discrepancy(stage: Stage, tmp_path: Path) -> None:
    # The 32B model: no disconnects, no kill, so its drift is 0 and any injected row shows.
    model = "qwen2.5-32b-instruct"
    common = [
        *_window(stage),
        "--model",
        model,
        "--prometheus-url",
        stage.url,
        "--database-url",
        stage.database_url,
    ]
    ok = _ops("drift", *common, cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "drift" in ok.stdout
    with psycopg.connect(stage.database_url, autocommit=True) as conn:
        team = conn.execute("SELECT id FROM teams LIMIT 1").fetchone()
        assert team is not None
        conn.execute(
            "INSERT INTO usage_ledger (request_id, team_id, model, prompt_price_per_million,"
            " completion_price_per_million, estimated_cost_microcredits, completion_tokens, status, created_at,"
            " finalized_at) VALUES ('injected-drift', %s, %s, 0, 0, 0, 500, 'settled', now(), to_timestamp(%s))",
            (team[0], model, stage.ended - 5),
        )
    try:
        bad = _ops("drift", *common, cwd=tmp_path)
    finally:
        with psycopg.connect(stage.database_url, autocommit=True) as conn:
            conn.execute("DELETE FROM usage_ledger WHERE request_id = 'injected-drift'")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    line = next(x for x in bad.stdout.splitlines() if x.startswith("drift"))
    assert float(line.split()[1].rstrip("%")) > 0.1
    assert list(tmp_path.iterdir()) == []  # it writes nothing


def _settled_tokens_in_iso_week(database_url: str, week: str) -> int:
    """The ledger's settled completion tokens finalized in `week` (a stage that straddles Monday 00:00 UTC
    has rows in two weeks; the report covers one)."""
    monday, next_monday = iso_week(week)
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT COALESCE(SUM(completion_tokens), 0) FROM usage_ledger WHERE status = 'settled'"
            " AND finalized_at >= %s AND finalized_at < %s",
            (monday, next_monday),
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_ops_cost_report_on_the_stage_data(stage: Stage, tmp_path: Path) -> None:
    week = dt.datetime.fromtimestamp(stage.ended, dt.UTC).strftime("%G-W%V")
    out = tmp_path / "out"
    out.mkdir()
    args = [
        "--week",
        week,
        "--step",
        "1",
        "--prometheus-url",
        stage.url,
        "--database-url",
        stage.database_url,
        "--out",
        str(out),
    ]
    done = _ops("cost-report", *args, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in out.iterdir()) == [f"cost-{week}.{x}" for x in ("csv", "md", "png")]
    assert (out / f"cost-{week}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = {
        r.split(",")[1]: r.split(",")
        for r in (out / f"cost-{week}.csv").read_text().splitlines()[1:]
        if r.split(",")[4] != "0"
    }
    csv_tokens = sum(int(r.split(",")[4]) for r in (out / f"cost-{week}.csv").read_text().splitlines()[1:])
    assert csv_tokens == _settled_tokens_in_iso_week(stage.database_url, week) > 0
    assert MODEL_8B in rows
    assert float(rows[MODEL_8B][3]) > 0
    table = {line.split("|")[1].strip(): line for line in done.stdout.splitlines() if line.startswith("| ")}
    assert float(table[MODEL_8B].split("|")[2]) > 0  # cloud GPU hours of the cloud 8B engine
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_ops_bad_input_one_line_exit_2(stage: Stage, tmp_path: Path) -> None:
    db = ["--database-url", stage.database_url]
    cases: list[tuple[list[str], str]] = [
        (
            ["drift", "--from=-1h", "--to", "now", "--prometheus-url", "http://127.0.0.1:9", *db],
            "not reachable",
        ),
        (["drift", "--from", "now", "--to=-1h", "--prometheus-url", stage.url, *db], "empty window"),
        (
            ["drift", "--from", "2001-01-01", "--to", "2001-01-02", "--prometheus-url", stage.url, *db],
            "empty window",
        ),
        (
            ["drift", "--from=-1h", "--to", "now", "--model", "gpt-9", "--prometheus-url", stage.url, *db],
            "unknown model",
        ),
        (["cost-report", "--week", "2026-49", "--prometheus-url", stage.url, *db], "ISO week"),
        (["cost-report", "--week", "2001-W02", "--prometheus-url", stage.url, *db], "empty window"),
    ]
    for args, message in cases:
        done = _ops(*args, cwd=tmp_path)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert message in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []


def _scaled_object_queries() -> list[tuple[str, str]]:
    from infra.render import render

    out = []
    for row in render("prod"):
        if row["type"].endswith(":ScaledObject"):
            for trigger in row["inputs"]["spec"]["triggers"]:
                if trigger["type"] == "prometheus":
                    out.append((f"{row['name']}/{trigger.get('name')}", trigger["metadata"]["query"]))
    return out


def test_every_keda_query_of_the_prod_stack_returns_exactly_one_series(stage: Stage) -> None:
    queries = _scaled_object_queries()
    assert queries
    wrong: dict[str, Any] = {}
    for name, expr in queries:
        result = query(stage.url, expr)
        if len(result) != 1:
            wrong[name] = (expr, result)
    assert not wrong, wrong


def test_dev_prometheus_without_the_binary_is_a_clear_error(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "apps.cli.main", "dev", "--prometheus", "--data-dir", str(tmp_path / "d")],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "prometheus binary is not on PATH" in done.stderr
    assert not (tmp_path / "d").exists()  # nothing started
