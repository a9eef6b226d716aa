"""The pinned AMI alias publishes AMIs for the cluster's Kubernetes version (issue 26 item 1).

`al2023@v20251120` has AMIs for Kubernetes 1.29-1.34 only: with a 1.35 cluster Karpenter's alias
lookup finds nothing and every GPU pod stays Pending while `pulumi up` reports success.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from infra.amis import RELEASES_FILE, UnpublishedAmi, check_alias, published_versions, releases
from infra.render import config_for, render_program
from tests.infra.conftest import STACKS

SIDECAR = RELEASES_FILE.with_name("amazon-eks-ami-releases.source.json")


def test_the_vendored_list_names_its_source_and_its_known_boundaries() -> None:
    source = json.loads(SIDECAR.read_text(encoding="utf-8"))
    assert source["upstream_repository"] == "https://github.com/awslabs/amazon-eks-ami"
    assert len(source["upstream_commit"]) == 40
    assert len(source["git_blob_sha1"]) == 40
    assert source["newest_release_listed"] == max(releases())
    # The facts the issue names, as the upstream CHANGELOG lists them.
    assert published_versions("v20251120") == ["1.29", "1.30", "1.31", "1.32", "1.33", "1.34"]
    assert "1.35" in published_versions("v20260114")
    first_135 = min(r for r in releases() if "1.35" in published_versions(r))
    assert first_135 == "v20260114"


@pytest.mark.parametrize(
    ("alias", "message"),
    [
        ("al2023@v20251120", r"publishes AL2023 nvidia AMIs for Kubernetes 1\.29.*1\.34 only, not 1\.35"),
        ("al2023@latest", "pin an AL2023 release"),
        ("al2023@v20990101", "not in infra/amis"),
        ("al2023@v20260128", "abandoned"),
    ],
)
def test_an_alias_without_amis_for_the_version_is_refused(alias: str, message: str) -> None:
    with pytest.raises(UnpublishedAmi, match=message):
        check_alias(alias, "1.35")


def test_a_release_that_publishes_the_version_is_accepted() -> None:
    assert check_alias("al2023@v20260114", "1.35") == "v20260114"


@pytest.mark.parametrize("stack", STACKS)
def test_the_render_fails_on_an_unpublished_alias_and_the_stacks_pin_a_published_one(stack: str) -> None:
    config = config_for(stack)
    with pytest.raises(UnpublishedAmi):
        render_program(stack, dataclasses.replace(config, ami_alias="al2023@v20251120"))
    release = config.ami_alias.split("@")[1]
    assert "1.35" in published_versions(release, "nvidia")
