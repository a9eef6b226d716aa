"""KEDA and the HPA as they compute replicas, driven by the ScaledObject the Pulumi program renders.

KEDA (https://keda.sh/docs/2.21/concepts/scaling-deployments/, "Activating and Scaling
thresholds"; https://keda.sh/docs/2.21/reference/scaledobject-spec/): every `pollingInterval`
each trigger is read; the object is *active* when any trigger's value is `> activationThreshold`
(default 0). KEDA alone does 0 -> 1 (to `max(minReplicaCount, 1)`) when active, and 1 -> 0 when
`minReplicaCount` is 0 and no trigger has been active for `cooldownPeriod`. Between 1 and N the
HPA it creates decides (min `max(minReplicaCount, 1)`, max `maxReplicaCount`).

HPA (https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/#algorithm-details;
KEP-853 for `behavior`): per metric `desired = ceil(current x value / target)`; for an
`AverageValue` external metric that is `ceil(value / target)`, and nothing changes while
`|value / (target x current) - 1| <= 0.1` (the default tolerance). The largest proposal over the
metrics wins. Then stabilisation: the scale-up recommendation is the minimum of the proposals in the
last `scaleUp.stabilizationWindowSeconds`, the scale-down one the maximum over the scale-down window.
Then the rate policies: a `Pods` policy allows `value` pods per `periodSeconds` counted from the
replicas at the start of that period, a `Percent` policy `value` percent; `selectPolicy: Max`
takes the policy allowing the largest change. KEDA's cron scaler reports `desiredReplicas` inside
its window against a target of 1 (so `desired = desiredReplicas`) and is active only inside it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

TOLERANCE = 0.1


@dataclass(frozen=True)
class Policy:
    kind: str  # Pods | Percent
    value: int
    period_s: int


@dataclass(frozen=True)
class Rules:
    window_s: int
    policies: tuple[Policy, ...]
    select: str = "Max"


@dataclass(frozen=True)
class Trigger:
    name: str
    kind: str  # prometheus | cron
    threshold: float
    activation: float
    query: str = ""
    cron: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ScalerSpec:
    name: str
    deployment: str
    min_replicas: int
    max_replicas: int
    polling_s: int
    cooldown_s: int
    up: Rules
    down: Rules
    triggers: tuple[Trigger, ...]


# Defaults of autoscaling/v2 when a direction has no rules: up "double or +4 pods per 15 s" with no
# stabilization window, down "remove all per 15 s" after a 300 s window (kubernetes/api
# autoscaling/v2/types.go, HPAScalingRules).
_DEFAULT_UP = Rules(0, (Policy("Percent", 100, 15), Policy("Pods", 4, 15)))
_DEFAULT_DOWN = Rules(300, (Policy("Percent", 100, 15),))


def _rules(raw: Mapping[str, Any] | None, default: Rules) -> Rules:
    if not raw:
        return default
    policies = tuple(
        Policy(p["type"], int(p["value"]), int(p["periodSeconds"])) for p in raw.get("policies", [])
    )
    return Rules(
        int(raw.get("stabilizationWindowSeconds", default.window_s)),
        policies or default.policies,
        raw.get("selectPolicy", "Max"),
    )


def scaler_spec(obj: Mapping[str, Any]) -> ScalerSpec:
    """The parts of a rendered ScaledObject that decide replicas (KEDA's defaults where absent)."""
    spec = obj["spec"]
    behavior = spec.get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get("behavior", {})
    triggers = []
    for t in spec["triggers"]:
        meta = t["metadata"]
        if t["type"] == "cron":
            triggers.append(Trigger(t.get("name", "cron"), "cron", 1.0, 0.0, cron=meta))
        else:
            triggers.append(
                Trigger(
                    t.get("name", t["type"]),
                    t["type"],
                    float(meta["threshold"]),
                    float(meta.get("activationThreshold", 0)),
                    query=meta["query"],
                )
            )
    return ScalerSpec(
        name=obj["metadata"]["name"],
        deployment=spec["scaleTargetRef"]["name"],
        min_replicas=int(spec.get("minReplicaCount", 0)),
        max_replicas=int(spec.get("maxReplicaCount", 100)),
        polling_s=int(spec.get("pollingInterval", 30)),
        cooldown_s=int(spec.get("cooldownPeriod", 300)),
        up=_rules(behavior.get("scaleUp"), _DEFAULT_UP),
        down=_rules(behavior.get("scaleDown"), _DEFAULT_DOWN),
        triggers=tuple(triggers),
    )


def metric_proposal(current: int, value: float, target: float) -> int:
    """One `AverageValue` metric's replica proposal (the tolerance keeps `current`)."""
    if current > 0 and abs(value / (target * current) - 1.0) <= TOLERANCE:
        return current
    return math.ceil(round(value / target, 9))


def _limit(rules: Rules, current: int, events: deque[tuple[float, int]], now: float, up: bool) -> int:
    limits = []
    for p in rules.policies:
        changed = sum(d for t, d in events if t > now - p.period_s and (d > 0) == up)
        start = current - changed  # replicas at the start of the period
        if up:
            limits.append(start + p.value if p.kind == "Pods" else math.ceil(start * (1 + p.value / 100)))
        else:
            limits.append(start - p.value if p.kind == "Pods" else math.floor(start * (1 - p.value / 100)))
    pick: Callable[..., int] = max if (rules.select == "Max") == up else min
    return pick(limits) if limits else current


@dataclass
class Hpa:
    spec: ScalerSpec
    recommendations: deque[tuple[float, int]] = field(default_factory=deque)
    events: deque[tuple[float, int]] = field(default_factory=deque)

    def desired(self, now: float, current: int, values: Mapping[str, float]) -> int:
        s = self.spec
        proposals = [metric_proposal(current, values[t.name], t.threshold) for t in s.triggers]
        raw = max(proposals) if proposals else current
        self.recommendations.append((now, raw))
        horizon = max(s.up.window_s, s.down.window_s)
        while self.recommendations and self.recommendations[0][0] <= now - horizon:
            self.recommendations.popleft()
        # A recommendation counts while its time is after `now - window` (kube's `After(cutoff)`).
        up_rec = min([n for t, n in self.recommendations if t > now - s.up.window_s] + [raw])
        down_rec = max([n for t, n in self.recommendations if t > now - s.down.window_s] + [raw])
        target = min(max(current, up_rec), down_rec)
        while self.events and self.events[0][0] <= now - 1800:
            self.events.popleft()
        if target > current and s.up.select != "Disabled":
            target = min(target, _limit(s.up, current, self.events, now, up=True))
        elif target < current and s.down.select != "Disabled":
            target = max(target, _limit(s.down, current, self.events, now, up=False))
        elif target != current:
            target = current
        target = max(max(s.min_replicas, 1), min(s.max_replicas, target))
        if target != current:
            self.events.append((now, target - current))
        return target


@dataclass
class Keda:
    """One ScaledObject: `poll` returns the Deployment's new replica count."""

    spec: ScalerSpec
    hpa: Hpa = field(init=False)
    last_active: float = -math.inf

    def __post_init__(self) -> None:
        self.hpa = Hpa(self.spec)

    def poll(
        self, now: float, current: int, values: Mapping[str, float], cron_active: Mapping[str, bool]
    ) -> int:
        s = self.spec
        active = any(
            cron_active.get(t.name, False) if t.kind == "cron" else values[t.name] > t.activation
            for t in s.triggers
        )
        if active:
            self.last_active = now
        if current == 0:
            return max(s.min_replicas, 1) if active else 0
        if s.min_replicas == 0 and not active and now - self.last_active >= s.cooldown_s:
            self.hpa = Hpa(s)  # the HPA is left alone at zero; its history does not carry over
            return 0
        return self.hpa.desired(now, current, values)
