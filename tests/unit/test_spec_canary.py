"""A model's canary in the stack spec (`models.<name>.canary`, issue 30): a second live revision,
refused with the field path and the reason when it cannot be one."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from apps.core.errors import SpecError
from apps.core.spec import STACKS_DIR, Canary, parse_spec

MODEL = "llama-3.1-8b-instruct"
AT_MODEL = rf"x\.yaml: models\.{re.escape(MODEL)}"
WHERE = rf"{AT_MODEL}\.canary"


def _with_canary(canary: Any) -> dict[str, Any]:
    data = yaml.safe_load((STACKS_DIR / "prod.yaml").read_text())
    data["models"][MODEL]["canary"] = canary
    return dict(data)


def test_a_canary_names_a_second_revision_with_its_own_small_bounds() -> None:
    spec = parse_spec(_with_canary({"revision": "2026-12-01"}), "x.yaml")
    model = spec.models[MODEL]
    assert model.canary == Canary(revision="2026-12-01", min_replicas=1, max_replicas=2)
    assert model.canary.revision != model.revision
    bounded = parse_spec(_with_canary({"revision": "2026-12-01", "min_replicas": 2, "max_replicas": 3}))
    assert (bounded.models[MODEL].canary.min_replicas, bounded.models[MODEL].canary.max_replicas) == (2, 3)  # type: ignore[union-attr]
    # Without one nothing changes: the shipped stacks have none.
    assert parse_spec(_with_canary(None)).models[MODEL].canary is None


def test_the_stable_revision_is_not_a_canary() -> None:
    stable = _with_canary(None)["models"][MODEL]["revision"]
    with pytest.raises(SpecError, match=rf"{AT_MODEL}: canary\.revision '{stable}' is the model's revision"):
        parse_spec(_with_canary({"revision": stable}), "x.yaml")


@pytest.mark.parametrize(
    ("revision", "reason"),
    [
        ("", "must not be empty"),
        ("   ", "must not be empty"),
        ("2026/12/01", "is not one path component"),
        ("..", "is not one path component"),
        (".hidden", "is not one path component"),
        (" 2026-12-01", "surrounding spaces"),
        ("r" * 129, "129 characters, at most 128"),
    ],
)
def test_a_canary_revision_must_be_one_path_component(revision: str, reason: str) -> None:
    with pytest.raises(SpecError, match=rf"{WHERE}\.revision: .*{reason}"):
        parse_spec(_with_canary({"revision": revision}), "x.yaml")


@pytest.mark.parametrize(
    ("canary", "reason"),
    [
        ({}, r"\.revision: Field required"),
        ({"revision": "b", "min_replicas": 0}, r"\.min_replicas: 0: a canary keeps at least 1 replica"),
        ({"revision": "b", "max_replicas": 0}, r"\.max_replicas: Input should be greater than 0"),
        (
            {"revision": "b", "min_replicas": 3, "max_replicas": 2},
            r": min_replicas \(3\) must not exceed max_replicas \(2\)",
        ),
        ({"revision": "b", "weight": 10}, r"\.weight: Extra inputs are not permitted"),
        ("b", r": Input should be a valid dictionary"),
    ],
)
def test_a_malformed_canary_is_refused(canary: Any, reason: str) -> None:
    with pytest.raises(SpecError, match=WHERE + reason):
        parse_spec(_with_canary(canary), "x.yaml")


def test_the_plan_counts_the_canarys_floor_in_the_fleets_gpus_and_cost() -> None:
    """A canary's Deployment runs beside the stable one whatever the load: `llmfleet plan` during a
    canary counts its `min_replicas` (before, the plan's peak and cost left them out)."""
    from apps.core.sizing.plan import plan_fleet

    without = plan_fleet(parse_spec(_with_canary(None)))
    with_canary = plan_fleet(parse_spec(_with_canary({"revision": "2026-12-01", "min_replicas": 2})))
    per_replica = without.models[MODEL].gpus_per_replica
    assert without.models[MODEL].canary_gpus == 0
    assert with_canary.models[MODEL].canary_gpus == 2 * per_replica
    assert with_canary.gpus_peak == without.gpus_peak + 2 * per_replica
    assert with_canary.cost_per_hour_peak_usd > without.cost_per_hour_peak_usd
