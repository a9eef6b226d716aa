"""Nodes and pods of the simulated cluster, and Karpenter's part: launch, bin-pack, limits, consolidation.

A pending pod goes to an existing node of one of its NodePools with enough free GPUs, else
Karpenter launches the smallest instance size of the pool (`instance-gpu-count`) that holds it,
unless the pool's `limits` would be exceeded (then the pod stays pending). A launched node is
ready after a latency drawn from the configured distribution. A ready cloud node that has held no
pod for `consolidateAfter` is removed (empty consolidation; moving pods off under-utilised nodes
is not simulated). On-premises nodes are always present and never consolidated.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from apps.core.batching.fastforward import FastScheduler
from apps.core.batching.scheduler import StepResult
from apps.simulate.world import DeploymentSpec, PoolSpec

PENDING, LOADING, READY, DRAINING, GONE = "pending", "loading", "ready", "draining", "gone"


@dataclass(eq=False)
class Node:
    id: str
    pool: str  # NodePool name, or "onprem"
    capacity: str  # on-demand | spot | onprem
    gpus: int
    launched_at: float
    ready_at: float
    free: int = 0
    gone_at: float | None = None
    interrupted: bool = False
    cache: set[str] = field(default_factory=set)  # models on the local NVMe
    pods: list[Pod] = field(default_factory=list)
    empty_since: float | None = None

    @property
    def location(self) -> str:
        return "onprem" if self.capacity == "onprem" else "cloud"


@dataclass(eq=False)
class Pod:
    id: str
    deployment: str
    model: str
    gpus: int
    created: float
    engine: FastScheduler
    node: Node | None = None
    state: str = PENDING
    ready_at: float | None = None
    flights: dict[str, Any] = field(default_factory=dict)  # request id -> the simulator's flight
    version: int = 0  # bumps invalidate the engine's scheduled wake-up
    segment: tuple[float, float, int] | None = None  # fast-forward in progress: start, step, steps
    busy: bool = False  # a wake-up is scheduled
    initial: bool = False  # present at t = 0 (not a scale-up)
    pending: StepResult | None = None  # the step in progress, delivered at its end


@dataclass
class Karpenter:
    pools: dict[str, PoolSpec]
    rng: random.Random
    launch_s: tuple[float, float]  # uniform node launch latency (seconds)
    nodes: list[Node] = field(default_factory=list)
    serial: int = 0

    def pool_gpus(self, pool: str) -> int:
        return sum(n.gpus for n in self.nodes if n.pool == pool and n.gone_at is None)

    def place(self, pod: Pod, dep: DeploymentSpec, now: float) -> Node | None:
        """Bind `pod` to a node (launching one if needed); None if every pool is at its limit.

        kube-scheduler first: a ready node with room (allowed pools, preferred first). Then
        Karpenter: in-flight capacity of the preferred pool, a launch honouring the preference, and
        only then in-flight capacity elsewhere (Karpenter relaxes preferences last).
        """
        for name in dep.pools:
            for node in self._open(name, pod.gpus):
                if node.ready_at <= now:
                    return self.bind(pod, node)
        for node in self._open(dep.pools[0], pod.gpus):
            return self.bind(pod, node)
        for name in dep.pools:
            pool = self.pools[name]
            size = next((g for g in pool.gpus_per_instance if g >= pod.gpus), None)
            if size is not None and self.pool_gpus(name) + size <= pool.gpu_limit:
                self.serial += 1
                latency = self.rng.uniform(*self.launch_s)
                node = Node(f"{name}-{self.serial}", name, pool.capacity, size, now, now + latency, free=size)
                self.nodes.append(node)
                return self.bind(pod, node)
        for name in dep.pools[1:]:
            for node in self._open(name, pod.gpus):
                return self.bind(pod, node)
        return None

    def _open(self, pool: str, gpus: int) -> list[Node]:
        return [
            n
            for n in self.nodes
            if n.pool == pool and n.gone_at is None and not n.interrupted and n.free >= gpus
        ]

    def add_onprem(self, name: str, gpus: int) -> Node:
        node = Node(name, "onprem", "onprem", gpus, 0.0, 0.0, free=gpus)
        self.nodes.append(node)
        return node

    def bind(self, pod: Pod, node: Node) -> Node:
        node.free -= pod.gpus
        node.pods.append(pod)
        node.empty_since = None
        pod.node = node
        return node

    def release(self, pod: Pod, now: float) -> None:
        node = pod.node
        if node is None:
            return
        node.free += pod.gpus
        node.pods.remove(pod)
        if not node.pods:
            node.empty_since = now

    def consolidate(self, now: float) -> list[Node]:
        removed = []
        for node in self.nodes:
            if node.gone_at is not None or node.capacity == "onprem" or node.pods or node.ready_at > now:
                continue
            since = node.empty_since if node.empty_since is not None else node.ready_at
            if now - since >= self.pools[node.pool].consolidate_after_s:
                node.gone_at = now
                removed.append(node)
        return removed

    def remove(self, node: Node, now: float) -> None:
        node.gone_at = now
