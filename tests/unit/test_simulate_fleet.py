"""The simulator against the calibrated engine, `llmfleet plan`, and the brief's peak (issue 18 validations)."""

from __future__ import annotations

import heapq
import json
import subprocess
from pathlib import Path

import pytest

from apps.core.batching.fastforward import FastScheduler
from apps.core.batching.profile import catalog_profiles
from apps.core.batching.scheduler import Sequence
from apps.simulate import engines
from apps.simulate.cli import _profile_start
from apps.simulate.fleet import Pod
from apps.simulate.report import summary
from apps.simulate.sim import Settings, Simulation
from apps.simulate.trace import TraceRequest, constant, generate, profile
from apps.simulate.world import World, build_world, onprem_model, what_if

EIGHT_B = "llama-3.1-8b-instruct"
ROOT = Path(__file__).resolve().parents[2]


def test_engine_reproduces_enginesim_calibration_within_5_percent() -> None:
    """32 streams on one 8B replica: 47 tokens/s per stream, about 1,500 tokens/s per replica."""
    pod = Pod("p", "d", EIGHT_B, 1, 0.0, FastScheduler(catalog_profiles("prod")[EIGHT_B]))
    heap: list[tuple[float, int, int]] = []

    def schedule(t: float, p: Pod) -> None:
        heapq.heappush(heap, (t, len(heap) + 1000 * p.version, p.version))

    seqs = [Sequence(f"r{i}", 16, 2000, "stop", 0.0) for i in range(32)]
    for s in seqs:
        engines.add(pod, s, 0.0, schedule)
    while heap:
        _t, _, version = heapq.heappop(heap)
        if version != pod.version:
            continue
        engines.wake(pod, schedule)
        engines.plan(pod, schedule)
    per_stream = [(s.generated - 1) / (s.last_token_s - s.first_token_s) for s in seqs]  # type: ignore[operator]
    assert all(abs(r / 46.875 - 1) < 0.05 for r in per_stream), per_stream[:3]
    total = sum(s.generated for s in seqs) / max(s.last_token_s or 0 for s in seqs)
    assert abs(total / 1500 - 1) < 0.05, total


def _world(**what: object) -> World:
    return what_if(build_world("prod"), **what)  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_constant_load_settles_at_the_plans_replicas() -> None:
    world = _world()
    trace = []
    for name, mp in world.plan.models.items():
        # Short prompts: the plan's per-stream rates are decode rates (see docs/simulator.md).
        rows = constant(name, mp.peak_streams, mp.queue.service_time_s, 1800.0, 400)
        trace += [r.__class__(r.t, r.model, r.team, 16, r.max_tokens, r.answer_tokens) for r in rows]
    trace.sort(key=lambda r: r.t)
    sim = Simulation(
        world, trace, Settings(onprem_model=None, start=_profile_start(1, 10.0, "Europe/Berlin"))
    )
    rec = sim.run()
    at = [row for row in rec.timeline if 1500 <= row["t"] <= 1800]
    for name, mp in world.plan.models.items():
        settled = {row["models"][name]["desired"] for row in at}
        if world.spec.models[name].serving.headroom > 0 or mp.streams_target < mp.max_num_seqs:
            assert settled == {mp.replicas}, (name, settled, mp.replicas)
        else:
            # No headroom and slots = target (the 32B: 16 of 16): the scale-up from the floor queues,
            # and the 1,200 s scale-down window still holds the queue's recommendation (measured: 5).
            assert settled <= set(range(mp.replicas, mp.max_replicas + 1)), (name, settled, mp.replicas)


def _brief_peak(world: World) -> dict[str, object]:
    prof = profile("brief-peak")
    service = {m: p.queue.service_time_s for m, p in world.plan.models.items()}
    trace = generate(prof, service, seed=0)
    start = _profile_start(prof.start_weekday, prof.start_hour, world.infra.office_hours.timezone)
    return summary(Simulation(world, trace, Settings(start=start)).run())


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_brief_peak_on_prod_keeps_every_models_queue_wait_p95_under_5s_and_no_503() -> None:
    """The regression test of docs/simulator.md "Will it scale?" (one brief-peak run, about 5 s of CPU quiet).

    Seeds 0-6 were checked by hand when the office-hours pre-scale went in (docs/simulator.md);
    without it the 32B's p95 is 9.3 s (seed 0) and the 8B passes only when its burst pods find the
    32B node's free GPUs.
    """
    models = _brief_peak(_world())["models"]
    assert isinstance(models, dict)
    for name, m in models.items():
        assert m["rejected_503"] == 0, (name, m)
        assert m["refused_429"] == 0, (name, m)
        assert m["queue_wait_p95_s"] < 5.0, (name, m)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_brief_peak_with_mains_old_triggers_gives_503s(tmp_path: Path) -> None:
    """The same profile with main's ScaledObjects (the golden render before issue 18): 503s."""
    old_render = subprocess.run(
        ["git", "-C", str(ROOT), "show", "e8bfe1a:tests/fixtures/infra/prod.golden.json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    path = tmp_path / "main-prod.golden.json"
    path.write_text(old_render)
    old = _brief_peak(_world(scaled_objects=str(path)))
    old_models = old["models"]
    assert isinstance(old_models, dict)
    assert sum(m["rejected_503"] for m in old_models.values()) > 0, json.dumps(old_models)


def test_onprem_choice_ignores_headroom(tmp_path: Path) -> None:
    """Headroom on the 32B (cloud slack) must not move the on-premises servers to the 70B.

    Counting it did (5 x 2 GPUs vs the 70B's 2 x 4 for 8 on-prem GPUs), which made a what-if with
    more 32B headroom look worse: the 32B lost its 4 on-prem replicas and got hundreds of 503s.
    """
    text = (ROOT / "stacks" / "prod.yaml").read_text(encoding="utf-8")
    floor = "      replicas: {min: 1, max: 5}\n"
    assert floor in text
    stack = tmp_path / "prod.yaml"
    stack.write_text(text.replace(floor, floor + "      headroom: 0.3\n"), encoding="utf-8")
    world = build_world(str(stack))
    assert world.plan.models["qwen2.5-32b-instruct"].gpus == 10  # the headroom is in the plan
    assert onprem_model(world) == "qwen2.5-32b-instruct"
    assert onprem_model(_world()) == "qwen2.5-32b-instruct"
    assert onprem_model(world, None) is None


def test_the_simulator_queues_by_team_like_the_orchestrator() -> None:
    """The production fair queue, not a FIFO: a team arriving behind another team's flood is served
    at the next free slots, before the flood's earlier arrivals (a FIFO served it last)."""
    world = _world()
    model = "llama-3.3-70b-instruct-fp8"
    probe = Simulation(world, [], Settings(onprem_model=None))
    probe._initial_fleet()
    slots = sum(p.engine.profile.max_num_seqs for p in probe.by_model[model])
    assert slots > 0
    flood = [TraceRequest(i * 0.001, model, "team-a", 512, 300, 300) for i in range(3 * slots)]
    late = [TraceRequest(1.0 + i * 0.001, model, "team-b", 512, 300, 300) for i in range(3)]
    sim = Simulation(world, flood + late, Settings(onprem_model=None, until_s=120.0))
    sim.run()
    a = [f for f in sim.flights if f.req.team == "team-a"]
    b = [f for f in sim.flights if f.req.team == "team-b"]
    assert all(f.submitted is not None for f in b)
    queued_a = [f.submitted for f in a if f.queued_at is not None and f.submitted is not None]
    assert len(queued_a) >= slots // 2  # the flood waited (and was served: not all 503)
    assert max(f.submitted for f in b if f.submitted is not None) < max(queued_a)
    assert max(f.waited for f in b) < max(f.waited for f in a)
