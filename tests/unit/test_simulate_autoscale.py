"""KEDA and HPA arithmetic against cases worked by hand from the documented formulas.

HPA (kubernetes.io horizontal-pod-autoscale "Algorithm details"): desired = ceil(current x value /
target) = ceil(value / target) for AverageValue, unchanged within the 0.1 tolerance; scale-down
takes the max recommendation over the window; Pods policies cap the change per period. KEDA
(keda.sh scaling-deployments): active when value > activationThreshold; 0 -> 1 on activation,
1 -> 0 after cooldownPeriod without activity.
"""

from __future__ import annotations

import pytest

from apps.simulate.autoscale import Hpa, Keda, Policy, Rules, ScalerSpec, Trigger, metric_proposal


@pytest.mark.parametrize(
    ("current", "value", "target", "want"),
    [
        (4, 100.0, 24.62, 4),  # ratio 100 / 98.48 = 1.015: inside the tolerance, stays 4
        (4, 110.0, 24.62, 5),  # 110 / 98.48 = 1.117 > 1.1: ceil(110 / 24.62) = ceil(4.47) = 5
        (1, 50.0, 16.0, 4),  # ceil(3.125)
        (3, 50.0, 16.0, 3),  # 50 / 48 = 1.04: tolerance keeps 3 (a queue must build first)
        (2, 0.0, 8.0, 0),  # nothing to do: 0 (the HPA's min clamps it later)
        (5, 4.0, 0.8, 5),  # KV: sum 4.0 over 5 replicas = 0.8 average: exactly on target
    ],
)
def test_metric_proposal(current: int, value: float, target: float, want: int) -> None:
    assert metric_proposal(current, value, target) == want


def _spec(**kw: object) -> ScalerSpec:
    base: dict[str, object] = {
        "name": "so",
        "deployment": "d",
        "min_replicas": 0,
        "max_replicas": 8,
        "polling_s": 15,
        "cooldown_s": 750,
        "up": Rules(0, (Policy("Pods", 2, 60),)),
        "down": Rules(600, (Policy("Pods", 1, 300),)),
        "triggers": (Trigger("demand", "prometheus", 10.0, 18.0, query="q"),),
    }
    base.update(kw)
    return ScalerSpec(**base)  # type: ignore[arg-type]


def test_scale_up_is_capped_at_two_pods_per_minute() -> None:
    hpa = Hpa(_spec())
    # 1 replica, demand 100 -> ceil(100/10) = 10, capped at 1 + 2 = 3.
    assert hpa.desired(0.0, 1, {"demand": 100.0}) == 3
    # 30 s later the period still holds +2: the limit is (3 - 2) + 2 = 3.
    assert hpa.desired(30.0, 3, {"demand": 100.0}) == 3
    # After 60 s the period has rolled: 3 + 2 = 5.
    assert hpa.desired(61.0, 3, {"demand": 100.0}) == 5
    # max replicas 8 bounds it.
    assert hpa.desired(200.0, 7, {"demand": 100.0}) == 8


def test_scale_down_waits_for_the_window_then_one_pod_per_period() -> None:
    hpa = Hpa(_spec())
    assert hpa.desired(0.0, 6, {"demand": 60.0}) == 6
    # Demand drops to 20 (-> 2) at t = 15: the max recommendation of the last 600 s is still 6.
    for t in range(15, 600, 15):
        assert hpa.desired(float(t), 6, {"demand": 20.0}) == 6
    # At t = 600 the 6 from t = 0 left the window: down to 5 (one pod per 300 s).
    assert hpa.desired(600.0, 6, {"demand": 20.0}) == 5
    assert hpa.desired(615.0, 5, {"demand": 20.0}) == 5  # the period allows no second pod yet
    assert hpa.desired(901.0, 5, {"demand": 20.0}) == 4


def test_keda_activation_is_strictly_greater_and_cooldown_gates_zero() -> None:
    keda = Keda(_spec())
    assert keda.poll(0.0, 0, {"demand": 18.0}, {}) == 0  # 18 is not > 18
    assert keda.poll(15.0, 0, {"demand": 18.5}, {}) == 1  # KEDA's 0 -> 1
    assert keda.poll(30.0, 1, {"demand": 35.0}, {}) == 3  # the HPA: ceil(3.5) = 4, capped at 1 + 2
    # Inactive from t = 45: the HPA keeps >= 1 until cooldown (750 s since the last activity).
    assert keda.poll(45.0, 3, {"demand": 0.0}, {}) == 3
    assert keda.poll(775.0, 1, {"demand": 0.0}, {}) == 1
    assert keda.poll(780.0, 1, {"demand": 0.0}, {}) == 0


def test_cron_trigger_reports_desired_replicas_and_keeps_the_object_active() -> None:
    spec = _spec(triggers=(Trigger("office-hours", "cron", 1.0, 0.0, cron={"desiredReplicas": "1"}),))
    keda = Keda(spec)
    assert keda.poll(0.0, 0, {"office-hours": 1.0}, {"office-hours": True}) == 1
    assert keda.poll(15.0, 1, {"office-hours": 1.0}, {"office-hours": True}) == 1
    assert keda.poll(800.0, 1, {"office-hours": 0.0}, {"office-hours": False}) == 0
