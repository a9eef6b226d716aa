"""The discrete-event loop: arrivals, the orchestrator's queues and picker, engines, KEDA/HPA, Karpenter.

Time is simulated seconds from the trace's start. Every 15 s (the scrape interval and the HPA's
sync period) the simulator scrapes the metrics the ScaledObjects query, lets each ScaledObject
poll on its `pollingInterval`, reconciles Deployments to their replica counts, provisions pending
pods and consolidates empty nodes. The orchestrator is the production fair queue, picker and
retry policy (`apps/simulate/orchestrator.py`).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime

from apps.core.batching.fastforward import FastScheduler
from apps.core.scheduling.fairqueue import DEFAULT_MAX_LEN, DEFAULT_MAX_PER_TEAM, FairQueue
from apps.core.scheduling.service import TeamCounters
from apps.simulate import engines
from apps.simulate.autoscale import Keda
from apps.simulate.cron import CronWindow
from apps.simulate.fleet import DRAINING, GONE, LOADING, PENDING, READY, Karpenter, Node, Pod
from apps.simulate.metrics import Recorder, scrape
from apps.simulate.orchestrator import Flight, Orchestrator
from apps.simulate.promql import Samples, compile_query
from apps.simulate.trace import TraceRequest
from apps.simulate.world import World, onprem_model

TICK_S = 15.0
WAKE, NODE_READY, POD_READY, SPOT_NOTICE, SPOT_KILL, TICK, EXPIRE = range(7)


@dataclass(frozen=True)
class Settings:
    seed: int = 0
    node_launch_s: tuple[float, float] = (60.0, 180.0)  # uniform; EC2 + kubelet + GPU operator
    engine_start_s: float = 60.0  # vLLM start-up after the weights are local (CUDA graphs)
    s3_gib_per_s: float = 0.5  # model sync from S3 to the node's NVMe
    nvme_gib_per_s: float = 2.0  # weight load from NVMe into GPU memory
    spot_interruptions_per_node_hour: float = 0.0
    spot_notice_s: float = 120.0
    onprem_model: str | None = "auto"  # "auto": the model with the most GPUs per replica; None: no on-prem
    start: datetime = datetime(2026, 12, 1, 9, 0)  # t = 0 (UTC), for the cron triggers
    until_s: float | None = None
    prefix_hit_rate: float | None = None  # every model's; None: each model's `serving.prefix_hit_rate`


@dataclass
class Simulation(Orchestrator):
    world: World
    trace: list[TraceRequest]
    settings: Settings = field(default_factory=Settings)

    def __post_init__(self) -> None:
        s = self.settings
        self.rng = random.Random(s.seed)
        self.karpenter = Karpenter(self.world.pools, random.Random(s.seed + 1), s.node_launch_s)
        self.heap: list[tuple[float, int, int, object, int]] = []
        self.serial = 0
        self.pods: list[Pod] = []
        self.pending: list[Pod] = []
        self.by_model: dict[str, list[Pod]] = {m: [] for m in self.world.spec.models}
        self.now = 0.0
        self.fair: FairQueue[Flight] = FairQueue(
            max_len=DEFAULT_MAX_LEN,
            max_per_team=DEFAULT_MAX_PER_TEAM,
            service=TeamCounters(),
            clock=self._clock,
        )
        self.teams: dict[str, int] = {}
        self.team_weight = self.world.spec.sharing.default_weight
        self.flights: list[Flight] = []
        self.replicas: dict[str, int] = {}
        self.kedas = {d: Keda(spec) for d, spec in self.world.scalers.items()}
        self.queries = {
            (d, t.name): compile_query(t.query)
            for d, spec in self.world.scalers.items()
            for t in spec.triggers
            if t.query
        }
        self.crons = {
            (d, t.name): CronWindow(t.cron["start"], t.cron["end"], t.cron["timezone"], s.start.astimezone())
            for d, spec in self.world.scalers.items()
            for t in spec.triggers
            if t.kind == "cron"
        }
        self.samples = Samples()
        self.recorder = Recorder(self.world)
        self.orchestrators = self.world.infra.orchestrator_replicas
        self.limit_s = self.world.spec.slo.queue_limit_s
        self.hit_rates = {
            name: m.serving.prefix_hit_rate if s.prefix_hit_rate is None else s.prefix_hit_rate
            for name, m in self.world.spec.models.items()
        }

    # -- events -----------------------------------------------------------------------------

    def push(self, t: float, kind: int, obj: object, version: int = 0) -> None:
        self.serial += 1
        heapq.heappush(self.heap, (t, self.serial, kind, obj, version))

    def _wake_at(self, t: float, pod: Pod) -> None:
        self.push(t, WAKE, pod, pod.version)

    def _expire_at(self, f: Flight) -> None:
        self.push(f.deadline, EXPIRE, f, f.tries)

    def _clock(self) -> float:
        return self.now

    def run(self) -> Recorder:
        self._initial_fleet()
        end = self.settings.until_s or ((self.trace[-1].t if self.trace else 0.0) + 600.0)
        self.push(0.0, TICK, None)
        arrivals: Iterator[TraceRequest] = iter(self.trace)
        nxt = next(arrivals, None)
        now = 0.0
        while True:
            if nxt is not None and (not self.heap or nxt.t <= self.heap[0][0]):
                now = self.now = nxt.t
                self._arrive(nxt, now)
                nxt = next(arrivals, None)
                continue
            if not self.heap:
                break
            t, _, kind, obj, version = heapq.heappop(self.heap)
            if t > end and nxt is None:
                break
            now = self.now = t
            self._dispatch(kind, obj, version, now)
        self.recorder.finish(self, now)
        return self.recorder

    def _dispatch(self, kind: int, obj: object, version: int, now: float) -> None:
        if kind == WAKE:
            pod = obj
            assert isinstance(pod, Pod)
            if version == pod.version and pod.state != GONE:
                result = engines.wake(pod, self._wake_at)
                if result is not None:
                    self._deliver(pod, result, now)
                engines.plan(pod, self._wake_at)
        elif kind == EXPIRE:
            assert isinstance(obj, Flight)
            self._expire(obj, version, now)
        elif kind == TICK:
            self._tick(now)
        elif kind == NODE_READY:
            assert isinstance(obj, Node)
            self._node_ready(obj, now)
        elif kind == POD_READY:
            assert isinstance(obj, Pod)
            self._pod_ready(obj, now)
        elif kind == SPOT_NOTICE:
            assert isinstance(obj, Node)
            self._spot_notice(obj, now)
        elif kind == SPOT_KILL:
            assert isinstance(obj, Node)
            self._spot_kill(obj, now)

    # -- the cluster ------------------------------------------------------------------------

    def _new_pod(self, deployment: str, model: str, gpus: int, now: float) -> Pod:
        self.serial += 1
        profile = self.world.profiles[model]
        # Named as Kubernetes names a Deployment's pods (`<deployment>-<ReplicaSet hash>-<suffix>`):
        # the ScaledObjects' `pod` matchers (`infra/manifests/keda.py` `pod_matcher`) select them so.
        pod_id = f"{deployment}-5f8d9c-{self.serial:05x}"
        pod = Pod(pod_id, deployment, model, gpus, now, FastScheduler(profile))
        self.pods.append(pod)
        self.by_model[model].append(pod)
        return pod

    def _initial_fleet(self) -> None:
        """On-premises engines, then every Deployment at its replica count at t = 0, ready."""
        onprem = onprem_model(self.world, self.settings.onprem_model)
        for server in self.world.spec.onprem if onprem is not None else ():
            assert onprem is not None
            node = self.karpenter.add_onprem(server.name, server.gpus)
            tp = self.world.plan.models[onprem].gpus_per_replica
            for _ in range(server.gpus // tp):
                pod = self._new_pod(f"onprem-{server.name}", onprem, tp, 0.0)
                self.karpenter.bind(pod, node)
                pod.state, pod.ready_at, pod.initial = READY, 0.0, True
        for name, dep in self.world.deployments.items():
            count = self._initial_replicas(name)
            self.replicas[name] = count
            for _ in range(count):
                pod = self._new_pod(name, dep.model, dep.gpus, 0.0)
                placed = self.karpenter.place(pod, dep, 0.0)
                if placed is None:
                    self.pending.append(pod)
                    continue
                placed.ready_at = 0.0
                placed.cache.add(dep.model)
                pod.state, pod.ready_at, pod.initial = READY, 0.0, True

    def _initial_replicas(self, name: str) -> int:
        dep = self.world.deployments[name]
        keda = self.kedas.get(name)
        if keda is None:
            return dep.fixed_replicas or 0
        in_window = any(w.active(0.0) for (d, _), w in self.crons.items() if d == name)
        warm = max([int(t.cron["desiredReplicas"]) for t in keda.spec.triggers if t.kind == "cron"] or [0])
        return max(keda.spec.min_replicas, warm if in_window else 0)

    def _tick(self, now: float) -> None:
        self.samples.add(now, scrape(self, now))
        step = round(now / TICK_S)
        for name, keda in self.kedas.items():
            if step % max(1, round(keda.spec.polling_s / TICK_S)) != 0:
                continue
            values = {
                t.name: (self.queries[(name, t.name)](self.samples, now) or 0.0)
                for t in keda.spec.triggers
                if t.query
            }
            values.update({t.name: 0.0 for t in keda.spec.triggers if t.kind == "cron"})
            crons = {t: w.active(now) for (d, t), w in self.crons.items() if d == name}
            for t in keda.spec.triggers:
                if t.kind == "cron" and crons.get(t.name):
                    values[t.name] = float(t.cron["desiredReplicas"])
            self.replicas[name] = keda.poll(now, self.replicas[name], values, crons)
        for name in self.world.deployments:
            self._reconcile(name, now)
        self._provision(now)
        self.karpenter.consolidate(now)
        self.recorder.sample(self, now)
        self.push(now + TICK_S, TICK, None)

    def _live(self, deployment: str) -> list[Pod]:
        return [p for p in self.pods if p.deployment == deployment and p.state in (PENDING, LOADING, READY)]

    def _reconcile(self, name: str, now: float) -> None:
        dep = self.world.deployments[name]
        live = self._live(name)
        want = self.replicas.get(name, dep.fixed_replicas or 0)
        for _ in range(want - len(live)):
            self.pending.append(self._new_pod(name, dep.model, dep.gpus, now))
        if len(live) > want:
            # ReplicaSet order: unscheduled, then not ready, then newest first.
            order = {PENDING: 0, LOADING: 1, READY: 2}
            victims = sorted(live, key=lambda p: (order[p.state], -p.created))[: len(live) - want]
            for pod in victims:
                self._stop(pod, now)

    def _stop(self, pod: Pod, now: float) -> None:
        if pod.state in (PENDING, LOADING):
            self._pod_gone(pod, now)
            return
        pod.state = DRAINING
        if not pod.flights:
            self._pod_gone(pod, now)

    def _pod_gone(self, pod: Pod, now: float) -> None:
        pod.state = GONE
        pod.version += 1
        self.by_model[pod.model].remove(pod)
        self.pods.remove(pod)
        self.karpenter.release(pod, now)
        if pod in self.pending:
            self.pending.remove(pod)

    def _provision(self, now: float) -> None:
        still = []
        for pod in self.pending:
            node = self.karpenter.place(pod, self.world.deployments[pod.deployment], now)
            if node is None:
                still.append(pod)
                continue
            if node.launched_at == now and node.ready_at > now:
                self.push(node.ready_at, NODE_READY, node)
            elif node.ready_at <= now:
                self._load(pod, node, now)
        self.pending = still

    def _node_ready(self, node: Node, now: float) -> None:
        if node.gone_at is not None:
            return
        if node.capacity == "spot" and self.settings.spot_interruptions_per_node_hour > 0:
            gap = self.rng.expovariate(self.settings.spot_interruptions_per_node_hour / 3600)
            self.push(now + gap, SPOT_NOTICE, node)
        for pod in list(node.pods):
            if pod.state == PENDING:
                self._load(pod, node, now)

    def _load(self, pod: Pod, node: Node, now: float) -> None:
        s = self.settings
        weights = self.world.plan.models[pod.model].weights_gib
        sync = 0.0 if pod.model in node.cache else weights / s.s3_gib_per_s
        pod.state = LOADING
        self.push(now + sync + weights / s.nvme_gib_per_s + s.engine_start_s, POD_READY, pod)

    def _pod_ready(self, pod: Pod, now: float) -> None:
        if pod.state != LOADING:
            return
        pod.state, pod.ready_at = READY, now
        assert pod.node is not None
        pod.node.cache.add(pod.model)
        pod.engine.advance_to(now)
        self.recorder.pod_ready(pod, now)
        self._drain(pod.model, now)

    def _spot_notice(self, node: Node, now: float) -> None:
        if node.gone_at is not None:
            return
        node.interrupted = True
        for pod in list(node.pods):
            if pod.state in (PENDING, LOADING):
                self._pod_gone(pod, now)
            elif pod.state == READY:
                pod.state = DRAINING  # drained on the notice; the Deployment replaces it now
        self.recorder.interruptions += 1
        self.push(now + self.settings.spot_notice_s, SPOT_KILL, node)

    def _spot_kill(self, node: Node, now: float) -> None:
        for pod in list(node.pods):
            flights = list(pod.flights.values())
            pod.flights.clear()
            self._pod_gone(pod, now)
            for f in flights:
                assert isinstance(f, Flight)
                self._lost(f, pod, now)
        self.karpenter.remove(node, now)
