"""Which amazon-eks-ami release publishes AMIs for which Kubernetes version (vendored list).

Karpenter resolves an `al2023@vYYYYMMDD` alias to that release's AMIs for the cluster's
Kubernetes version (the standard, NVIDIA and Neuron variants); a release that published
none for it makes every GPU NodeClaim fail to launch while `pulumi up` reports success.
`check_alias` turns that into a render-time error. Source of the list: the sidecar
`amazon-eks-ami-releases.source.json` (upstream CHANGELOG.md at a named commit).
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

from apps.core.errors import LlmfleetError

RELEASES_FILE = Path(__file__).parent / "amazon-eks-ami-releases.json"
ALIAS = re.compile(r"^al2023@(v\d{8})$")
# The GPU pools need the NVIDIA variant; the system node group uses EKS' own AMI type.
VARIANTS = ("nvidia", "standard")


class UnpublishedAmi(LlmfleetError):
    """The pinned AMI alias has no AMI for the cluster's Kubernetes version."""

    code = "unpublished_ami"


@cache
def releases() -> dict[str, dict[str, object]]:
    data: dict[str, dict[str, object]] = json.loads(RELEASES_FILE.read_text(encoding="utf-8"))
    return data


def published_versions(release: str, variant: str = "nvidia") -> list[str]:
    entry = releases().get(release)
    if entry is None:
        return []
    versions = entry[variant]
    assert isinstance(versions, list)
    return [str(v) for v in versions]


def check_alias(alias: str, kubernetes_version: str) -> str:
    """The release of `alias` if it publishes AL2023 AMIs (every variant) for the version, else raise."""
    match = ALIAS.match(alias)
    if match is None:
        raise UnpublishedAmi(
            f"AMI alias {alias!r}: pin an AL2023 release as al2023@vYYYYMMDD (`@latest` drifts)",
            param="amiAlias",
        )
    release = match.group(1)
    entry = releases().get(release)
    if entry is None:
        raise UnpublishedAmi(
            f"AMI alias {alias!r}: {release} is not in infra/amis/amazon-eks-ami-releases.json "
            "(add it from the amazon-eks-ami CHANGELOG)",
            param="amiAlias",
        )
    if entry["abandoned"]:
        raise UnpublishedAmi(f"AMI alias {alias!r}: release {release} was abandoned", param="amiAlias")
    for variant in VARIANTS:
        versions = published_versions(release, variant)
        if kubernetes_version not in versions:
            raise UnpublishedAmi(
                f"AMI alias {alias!r}: release {release} publishes AL2023 {variant} AMIs for Kubernetes "
                f"{', '.join(versions)} only, not {kubernetes_version}: no GPU node could launch",
                param="amiAlias",
            )
    return release
