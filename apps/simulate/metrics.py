"""What the simulator measures: the scraped series KEDA queries, and the per-request and fleet results."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from apps.simulate.fleet import DRAINING, READY, Node, Pod
from apps.simulate.promql import Labels

if TYPE_CHECKING:
    from apps.simulate.orchestrator import Flight
    from apps.simulate.sim import Simulation
    from apps.simulate.world import World

QUEUE_METRIC = "llmfleet_orchestrator_queue_depth"


def scrape(sim: Simulation, now: float) -> dict[str, list[tuple[Labels, float]]]:
    """The series Prometheus holds at `now`: vLLM's gauges of the cloud pods (on-premises engines sit
    behind NAT and are not scraped) and the queue gauge of every orchestrator replica."""
    out: dict[str, list[tuple[Labels, float]]] = defaultdict(list)
    for pod in sim.pods:
        if pod.state not in (READY, DRAINING) or pod.node is None or pod.node.location != "cloud":
            continue
        labels: Labels = (("model_name", pod.model), ("pod", pod.id))
        eng = pod.engine
        out["vllm:num_requests_running"].append((labels, float(len(eng.running))))
        out["vllm:num_requests_waiting"].append((labels, float(len(eng.waiting))))
        out["vllm:kv_cache_usage_perc"].append((labels, eng.kv_cache_usage))
    for model in sim.by_model:
        per = [0] * sim.orchestrators
        for f in sim.waiting(model):
            per[f.orch] += 1
        for i, n in enumerate(per):
            out[QUEUE_METRIC].append(((("model", model), ("replica", f"orchestrator-{i}")), float(n)))
    return out


@dataclass
class ModelStats:
    waits: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    tps: list[float] = field(default_factory=list)
    ttft_at: list[tuple[float, float]] = field(default_factory=list)  # (arrival, ttft) for the plot
    tokens: int = 0
    served: int = 0
    rejected: int = 0  # 503: no node within the queue limit
    refused: int = 0  # 429: the fair queue's admission (queue or team lanes full, predicted wait)
    failed: int = 0
    first_503_s: float | None = None
    first_scale_up_ready_s: float | None = None


@dataclass
class Recorder:
    world: World
    models: dict[str, ModelStats] = field(default_factory=dict)
    timeline: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    interruptions: int = 0
    first_scale_up_s: dict[str, float] = field(default_factory=dict)
    end_s: float = 0.0

    def __post_init__(self) -> None:
        self.models = {m: ModelStats() for m in self.world.spec.models}
        self._last_replicas: dict[str, int] = {}

    def served(self, f: Flight) -> None:
        st = self.models[f.req.model]
        st.served += 1
        st.tokens += f.tokens
        assert f.submitted is not None
        assert f.done is not None
        st.waits.append(f.waited)
        if f.first_token is not None:
            ttft = f.first_token - f.req.t
            st.ttft.append(ttft)
            st.ttft_at.append((f.req.t, ttft))
            if f.tokens > 1 and f.done > f.first_token:
                st.tps.append((f.tokens - 1) / (f.done - f.first_token))

    def rejected(self, f: Flight) -> None:
        st = self.models[f.req.model]
        st.rejected += 1
        assert f.done is not None
        st.waits.append(f.waited)
        if st.first_503_s is None:
            st.first_503_s = f.done

    def refused(self, f: Flight) -> None:
        self.models[f.req.model].refused += 1

    def failed(self, f: Flight) -> None:
        self.models[f.req.model].failed += 1

    def pod_ready(self, pod: Pod, now: float) -> None:
        st = self.models[pod.model]
        if not pod.initial and st.first_scale_up_ready_s is None:
            st.first_scale_up_ready_s = now

    def sample(self, sim: Simulation, now: float) -> None:
        row: dict[str, Any] = {"t": now, "cloud_gpus": 0, "models": {}}
        for node in sim.karpenter.nodes:
            if node.gone_at is None and node.location == "cloud":
                row["cloud_gpus"] += node.gpus
        for model, pods in sim.by_model.items():
            desired = sum(n for d, n in sim.replicas.items() if sim.world.deployments[d].model == model)
            row["models"][model] = {
                "ready": sum(1 for p in pods if p.state == READY),
                "desired": desired,
                "queue": sim.fair.depth(model),
            }
        for name, n in sim.replicas.items():
            if n > self._last_replicas.get(name, n) and name not in self.first_scale_up_s:
                self.first_scale_up_s[name] = now
            self._last_replicas[name] = n
        self.timeline.append(row)

    def finish(self, sim: Simulation, now: float) -> None:
        self.end_s = now
        self.nodes = list(sim.karpenter.nodes)
        for model in sim.by_model:
            for f in list(sim.waiting(model)):  # what is still queued at the end times out
                sim._timeout(f, f.deadline)

    def gpu_hours(self) -> float:
        """Cloud GPU hours: every cloud node from its launch (EC2 bills from there) to its removal."""
        total = 0.0
        for node in self.nodes:
            if node.location == "cloud":
                total += node.gpus * (
                    (node.gone_at if node.gone_at is not None else self.end_s) - node.launched_at
                )
        return total / 3600
