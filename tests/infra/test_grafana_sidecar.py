"""The dashboards ConfigMaps are what kube-prometheus-stack's Grafana sidecar loads (issue 13).

The sidecar's defaults for the pinned chart are vendored from its values.yaml
(`tests/fixtures/infra/charts/`); our Helm values are merged over them, as Helm does, and every
dashboard ConfigMap must carry the label the sidecar selects in a namespace it searches.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.infra.conftest import of_kind, pinned_chart_version

CHART = "kube-prometheus-stack"
FIXTURES = Path(__file__).parents[1] / "fixtures" / "infra" / "charts"


def _merge(base: Any, override: Any) -> Any:
    if isinstance(base, dict) and isinstance(override, dict):
        return {k: _merge(base.get(k), override[k]) if k in base else override[k] for k in override} | {
            k: v for k, v in base.items() if k not in override
        }
    return override


def _release(resources: list[dict[str, Any]]) -> dict[str, Any]:
    (release,) = [
        r["inputs"]
        for r in resources
        if r["type"] == "kubernetes:helm.sh/v3:Release" and r["inputs"].get("chart") == CHART
    ]
    return release


def _sidecar(resources: list[dict[str, Any]]) -> tuple[dict[str, Any], str]:
    release = _release(resources)
    fixture = FIXTURES / f"{CHART}-{release['version']}.grafana-sidecar.values.yaml"
    assert fixture.is_file(), (
        f"vendor the grafana sidecar defaults of {CHART} {release['version']}: {fixture}"
    )
    values = _merge(yaml.safe_load(fixture.read_text()), release.get("values", {}))
    return values["grafana"]["sidecar"]["dashboards"], release["namespace"]


def test_every_dashboard_config_map_is_picked_up_by_the_sidecar(
    resources: list[dict[str, Any]], kube: list[dict[str, Any]]
) -> None:
    sidecar, grafana_namespace = _sidecar(resources)
    assert sidecar["enabled"] is True
    search = sidecar.get("searchNamespace")
    watched = (
        None
        if search == "ALL"
        else {grafana_namespace, *([search] if isinstance(search, str) else search or [])}
    )
    boards = [cm for cm in of_kind(kube, "ConfigMap") if cm["metadata"]["name"].startswith("dashboard-")]
    assert len(boards) >= 3
    for cm in boards:
        meta = cm["metadata"]
        assert sidecar["label"] in meta["labels"], meta["name"]
        if sidecar.get("labelValue"):  # an empty labelValue selects on the key alone
            assert meta["labels"][sidecar["label"]] == sidecar["labelValue"], meta["name"]
        assert watched is None or meta["namespace"] in watched, meta["name"]
        assert all(key.endswith(".json") for key in cm["data"]), meta["name"]


def test_the_vendored_defaults_are_the_pinned_chart_s() -> None:
    version = pinned_chart_version(CHART)
    assert {p.name for p in FIXTURES.glob(f"{CHART}-*.yaml")} == {
        f"{CHART}-{version}.grafana-sidecar.values.yaml"
    }


def test_merge_lets_our_values_win() -> None:
    base = {"grafana": {"sidecar": {"dashboards": {"label": "grafana_dashboard", "labelValue": "1"}}}}
    ours = {"grafana": {"sidecar": {"dashboards": {"labelValue": "yes"}}, "nodeSelector": {"a": "b"}}}
    merged = _merge(base, ours)
    assert merged["grafana"]["sidecar"]["dashboards"] == {"label": "grafana_dashboard", "labelValue": "yes"}
    assert merged["grafana"]["nodeSelector"] == {"a": "b"}
