"""The upstream IAM policies of the controllers we install, for the exact chart versions we pin.

Each vendored document `<chart>-<version>.<kind>` sits next to a `<chart>-<version>.source.json`
naming where it comes from (repository, tag, commit, path, git blob hash). The controller roles
are built from these documents, so a chart bump without its policy fails the render with one
clear message instead of drifting to a hand-trimmed subset.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from apps.core.errors import LlmfleetError

POLICY_DIR = Path(__file__).parent
_PLACEHOLDER = re.compile(r"\$\{([A-Za-z0-9:.]+)\}")


class MissingUpstreamPolicy(LlmfleetError):
    """No vendored policy for a pinned chart version (or its source sidecar disagrees)."""

    code = "missing_upstream_policy"


@dataclass(frozen=True)
class UpstreamSource:
    chart: str
    chart_version: str
    file: str
    format: str
    url: str
    upstream_commit: str
    git_blob_sha1: str

    @property
    def path(self) -> Path:
        return POLICY_DIR / self.file


def source(chart: str, version: str) -> UpstreamSource:
    sidecar = POLICY_DIR / f"{chart}-{version}.source.json"
    if not sidecar.is_file():
        raise MissingUpstreamPolicy(
            f"no upstream IAM policy vendored for chart {chart} {version}: add "
            f"infra/policies/{chart}-{version}.source.json and the upstream document it names"
        )
    raw = json.loads(sidecar.read_text())
    src = UpstreamSource(**{k: raw[k] for k in UpstreamSource.__dataclass_fields__})
    if (src.chart, src.chart_version) != (chart, version) or not src.path.is_file():
        raise MissingUpstreamPolicy(f"{sidecar.name}: names {src.chart} {src.chart_version} / {src.file}")
    return src


def load_balancer_controller(version: str) -> dict[str, Any]:
    """The controller's `docs/install/iam_policy.json` for chart `version`, as upstream wrote it."""
    src = source("aws-load-balancer-controller", version)
    doc: dict[str, Any] = json.loads(src.path.read_text())
    return doc


class _CloudFormationLoader(yaml.SafeLoader):
    """Reads CloudFormation's short-form intrinsics (`!Sub`, `!Ref`, `!GetAtt`) as plain values."""


def _intrinsic(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    return loader.construct_mapping(node)  # type: ignore[arg-type]


for _tag in ("!Sub", "!Ref", "!GetAtt"):
    _CloudFormationLoader.add_constructor(_tag, _intrinsic)


def karpenter_template(version: str) -> dict[str, Any]:
    """Karpenter's getting-started CloudFormation template for `version` (intrinsics as plain values)."""
    src = source("karpenter", version)
    template: dict[str, Any] = yaml.load(src.path.read_text(), Loader=_CloudFormationLoader)  # noqa: S506
    return template


def karpenter_policy_templates(version: str) -> dict[str, str]:
    """The controller's managed policies of the getting-started template, `!Sub` text unresolved."""
    template = karpenter_template(version)
    return {
        name: str(res["Properties"]["PolicyDocument"])
        for name, res in template["Resources"].items()
        if res["Type"] == "AWS::IAM::ManagedPolicy"
    }


def substitute(template: str, values: dict[str, str]) -> str:
    """CloudFormation `!Sub`: every `${Name}` must have a value (an unknown one is an error)."""

    def one(match: re.Match[str]) -> str:
        if match.group(1) not in values:
            raise MissingUpstreamPolicy(f"upstream policy placeholder ${{{match.group(1)}}} has no value")
        return values[match.group(1)]

    return _PLACEHOLDER.sub(one, template)


def karpenter_controller(version: str, values: dict[str, str]) -> dict[str, Any]:
    """Karpenter's controller policy: the union of the template's managed policies, resolved."""
    statements: list[dict[str, Any]] = []
    for text in karpenter_policy_templates(version).values():
        statements.extend(json.loads(substitute(text, values))["Statement"])
    return {"Version": "2012-10-17", "Statement": statements}
