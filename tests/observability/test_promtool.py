"""The rendered rules pass `promtool check rules`; every alert fires and stays quiet on cue."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from apps.core.sizing.plan import plan_fleet
from apps.core.spec import Canary, load_spec
from infra.config import OfficeHours
from infra.manifests.alerts import RUNBOOK_URL, cost_alerts, rules_file, sli_alerts
from infra.manifests.common import slug
from tests.observability.rule_cases import covered_alerts, promtool_tests, s

pytestmark = [pytest.mark.promtool, pytest.mark.timeout(120)]
ROOT = Path(__file__).resolve().parents[2]


def _promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is not on PATH: `apt-get install prometheus` (.ci/run does)"
    return path


@pytest.mark.parametrize("stack", ["prod", "dev"])
def test_rules_pass_promtool_check_and_every_alert_has_a_test(tmp_path: Path, stack: str) -> None:
    spec = load_spec(stack)
    plan = plan_fleet(spec)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules_file(spec, plan, OfficeHours())))
    done = subprocess.run(
        [_promtool(), "check", "rules", "--lint=all", "--lint-fatal", str(tmp_path / "rules.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    names = {a.name for a in [*sli_alerts(spec), *cost_alerts(spec, plan)]}
    assert names == covered_alerts(plan)


def _test_rules(work: Path) -> subprocess.CompletedProcess[str]:
    """`promtool test rules tests.yaml` in `work` (where rules.yaml and tests.yaml are)."""
    return subprocess.run(
        [_promtool(), "test", "rules", "tests.yaml"], cwd=work, capture_output=True, text=True, check=False
    )


@pytest.mark.parametrize("stack", ["prod"])
def test_every_alert_fires_and_stays_quiet(tmp_path: Path, stack: str) -> None:
    spec = load_spec(stack)
    plan = plan_fleet(spec)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules_file(spec, plan, OfficeHours())))
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(promtool_tests(spec, plan, "rules.yaml")))
    done = _test_rules(tmp_path)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]


def test_promtool_catches_a_wrong_expectation(tmp_path: Path) -> None:
    """The harness can fail: a threshold moved past the synthetic series leaves an alert silent."""
    spec = load_spec("prod")
    plan = plan_fleet(spec)
    moved = spec.model_copy(update={"slo": spec.slo.model_copy(update={"ttft_p95_s": 10.0})})
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules_file(moved, plan, OfficeHours())))
    (tmp_path / "tests.yaml").write_text(
        yaml.safe_dump(promtool_tests(spec, plan, "rules.yaml", only={"LlmfleetTtftP95High"}))
    )
    done = _test_rules(tmp_path)
    assert done.returncode != 0
    assert "LlmfleetTtftP95High" in done.stdout + done.stderr


def test_every_alert_has_a_runbook_paragraph() -> None:
    spec = load_spec("prod")
    runbook = (ROOT / "docs" / "runbook.md").read_text()
    headings = {h.strip().lower() for h in re.findall(r"^### (\S+)\s*$", runbook, flags=re.M)}
    for alert in [*sli_alerts(spec), *cost_alerts(spec, plan_fleet(spec))]:
        assert alert.name.lower() in headings, f"docs/runbook.md has no '### {alert.name}'"
        assert alert.render()["annotations"]["runbook_url"] == f"{RUNBOOK_URL}#{alert.name.lower()}"
        assert alert.severity in {"critical", "warning", "info"}
        assert alert.summary


def test_a_canarys_floor_on_a_scale_to_zero_model_is_not_idle_capacity(tmp_path: Path) -> None:
    """A canary of the scale-to-zero model keeps `canary.min_replicas` pods on purpose: with only the
    canary's Deployment up and an empty queue outside the warm window (02:10), LlmfleetScaleToZeroModelIdle
    stays quiet; with the stable Deployment up too, it fires as before (before, the canary alone made it fire)."""
    spec = load_spec("prod")
    zero = next(n for n, m in plan_fleet(spec).models.items() if m.min_replicas == 0)
    model = spec.models[zero].model_copy(update={"canary": Canary(revision="2026-12-01")})
    spec = spec.model_copy(update={"models": {**spec.models, zero: model}})
    plan = plan_fleet(spec)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules_file(spec, plan, OfficeHours())))
    dep = f"vllm-{slug(zero)}"
    empty = [
        s("llmfleet_orchestrator_queue_depth", "0x700", model=zero, instance="o:8081"),
        s("vllm:num_requests_running", "0x700", model_name=zero, engine="0", instance="v:8000"),
    ]
    canary_up = s(
        "kube_deployment_status_replicas", "1x700", namespace="llmfleet", deployment=f"{dep}-canary"
    )
    stable_up = s("kube_deployment_status_replicas", "1x700", namespace="llmfleet", deployment=dep)
    alert = next(a for a in cost_alerts(spec, plan) if a.name == "LlmfleetScaleToZeroModelIdle")
    fired = {
        "exp_labels": {"severity": alert.severity, "model": zero},
        "exp_annotations": {
            "summary": f"{zero} runs replicas with an empty queue outside its warm window",
            "runbook_url": f"{RUNBOOK_URL}#{alert.name.lower()}",
        },
    }
    tests = [
        {
            "interval": "1m",
            "input_series": series,
            "alert_rule_test": [{"eval_time": "130m", "alertname": alert.name, "exp_alerts": expected}],
        }
        for series, expected in (([canary_up, *empty], []), ([canary_up, stable_up, *empty], [fired]))
    ]
    doc = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(doc))
    done = _test_rules(tmp_path)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
