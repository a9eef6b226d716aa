"""The prefix-cache hit rate in `llmfleet plan` (prompt price at that rate) and `llmfleet simulate`
(that share of each prompt's prefill found in the engine's cache) (issue 29 item 4)."""

from __future__ import annotations

import json

import pytest

from apps.cli.main import main
from apps.core.spec import load_spec
from apps.simulate.report import summary
from apps.simulate.sim import Settings, Simulation
from apps.simulate.trace import TraceRequest
from apps.simulate.world import build_world

pytestmark = pytest.mark.timeout(120)
EIGHT_B = "llama-3.1-8b-instruct"


def test_the_plan_prices_prompts_at_the_hit_rate(capsys: pytest.CaptureFixture[str]) -> None:
    prices = load_spec("prod").models[EIGHT_B].prices
    assert main(["plan", "--json", "--prefix-hit-rate", "0.6"]) == 0
    m8 = json.loads(capsys.readouterr().out)["models"][EIGHT_B]
    assert m8["prefix_hit_rate"] == 0.6
    want = 0.4 * prices.prompt_per_million_microcredits + 0.6 * prices.cached_prompt
    assert m8["prompt_microcredits_per_million"] == round(want)
    assert m8["prompt_microcredits_per_million"] < prices.prompt_per_million_microcredits
    assert main(["plan"]) == 0  # the stack's own rate (none): the full prompt price, in the table
    table = capsys.readouterr().out
    assert "credits/M prompt" in table
    assert f"{prices.prompt_per_million_microcredits / 1_000_000:.4f}" in table


@pytest.mark.parametrize("rate", [-0.1, 1.5])
def test_a_hit_rate_outside_0_to_1_is_refused(rate: float, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--prefix-hit-rate", str(rate)]) == 2
    assert "prefix_hit_rate" in capsys.readouterr().err


def _run(rate: float) -> tuple[dict[str, float], Simulation]:
    """Long prompts to the 8B model, two a second for a minute (well inside its replicas' slots)."""
    trace = [TraceRequest(i * 0.5, EIGHT_B, "team-a", 6000, 40, 40) for i in range(120)]
    sim = Simulation(build_world("prod"), trace, Settings(onprem_model=None, prefix_hit_rate=rate))
    return summary(sim.run())["models"][EIGHT_B], sim


def test_the_simulator_skips_the_cached_share_of_prefill() -> None:
    cold, cold_sim = _run(0.0)
    warm, warm_sim = _run(0.8)
    assert cold["served"] == warm["served"] == 120
    # 6,000 prompt tokens at the 8B profile's prefill rate is most of its first token's time:
    # 80 % of them found cached is at least half of it saved (the simulation is deterministic).
    assert warm["ttft_p50_s"] < 0.5 * cold["ttft_p50_s"], (warm, cold)
    engines = [p.engine.prefix for p in warm_sim.pods if p.model == EIGHT_B]
    hits, queries = sum(e.hits for e in engines), sum(e.queries for e in engines)
    assert 0.7 < hits / queries <= 0.8  # each engine computes the shared part once
    assert sum(p.engine.prefix.queries for p in cold_sim.pods) == 0  # no hit rate: no prefix modelled
