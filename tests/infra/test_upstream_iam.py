"""The controller roles grant what upstream's policy for the pinned chart grants (issue 13, item 6).

The documents in `infra/policies/` are verbatim upstream copies (their git blob hash is in the
sidecar); the roles are built from them, and a chart bump without its policy fails here and in
the render.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from apps.core.errors import LlmfleetError
from infra.manifests.iam import (
    granted_actions,
    is_scoped,
    karpenter_controller,
    load_balancer_controller,
    unscoped_mutations,
)
from infra.policies import upstream
from infra.policies.upstream import POLICY_DIR, MissingUpstreamPolicy
from tests.infra.conftest import pinned_controller_charts, upstream_controller_policies

PINNED = pinned_controller_charts()
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
# IAM's quota: the inline policies of one role add up to at most 10,240 non-whitespace characters.
INLINE_POLICY_LIMIT = 10_240


def _git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _rendered(resources: list[dict[str, Any]], name: str) -> dict[str, Any]:
    row = next(r for r in resources if r["type"] == ROLE_POLICY and r["name"] == name)
    doc: dict[str, Any] = json.loads(row["inputs"]["policy"])
    return doc


def _statements(policy: dict[str, Any], action: str) -> list[dict[str, Any]]:
    out = []
    for stmt in policy["Statement"]:
        actions = stmt["Action"]
        if action in ([actions] if isinstance(actions, str) else actions):
            out.append(stmt)
    return out


@pytest.mark.parametrize("chart", sorted(PINNED))
def test_every_pinned_controller_chart_has_its_verbatim_upstream_policy(chart: str) -> None:
    src = upstream.source(chart, PINNED[chart])
    assert src.chart_version == PINNED[chart]
    assert _git_blob_sha1(src.path.read_bytes()) == src.git_blob_sha1, f"{src.file} is not upstream's text"
    assert src.url.startswith("https://")
    assert len(src.upstream_commit) == 40


def _parsed(chart: str, version: str) -> Any:
    """The vendored document as the program parses it (what the roles are built from)."""
    if chart == "karpenter":
        template = upstream.karpenter_template(version)["Resources"]
        return {
            n: r["Properties"]["PolicyDocument"]
            for n, r in template.items()
            if r["Type"] == "AWS::IAM::ManagedPolicy"
        }
    return upstream.load_balancer_controller(version)


@pytest.mark.parametrize("chart", sorted(PINNED))
def test_the_vendored_file_is_the_blob_upstream_s_tag_holds_and_parses_to_its_document(chart: str) -> None:
    """Checked against what was fetched from upstream (`fetched` in the sidecar: the tag's commit and
    `git ls-tree` line, and the digest of upstream's document parsed at that tag), not against a
    hash computed from the vendored copy itself."""
    src = upstream.source(chart, PINNED[chart])
    sidecar = json.loads((POLICY_DIR / f"{chart}-{PINNED[chart]}.source.json").read_text())
    fetched = sidecar["fetched"]
    assert fetched["tag_commit"] == src.upstream_commit, "the commit is not the one the tag names"
    mode, kind, rest = fetched["ls_tree"].split(" ", 2)
    blob, path = rest.split("\t")
    assert (mode, kind, path) == ("100644", "blob", sidecar["upstream_path"])
    assert _git_blob_sha1(src.path.read_bytes()) == blob, (
        f"{src.file} is not the blob at {sidecar['upstream_tag']}"
    )
    assert src.git_blob_sha1 == blob
    canonical = json.dumps(_parsed(chart, PINNED[chart]), sort_keys=True, separators=(",", ":"))
    assert hashlib.sha256(canonical.encode()).hexdigest() == sidecar["parsed_sha256"], (
        f"{src.file} does not parse to upstream's document at {sidecar['upstream_tag']}"
    )


def test_no_policy_is_vendored_for_a_version_we_do_not_pin() -> None:
    vendored = {p.name.removesuffix(".source.json") for p in POLICY_DIR.glob("*.source.json")}
    assert vendored == {f"{chart}-{version}" for chart, version in PINNED.items()}


def test_a_chart_bump_without_its_policy_fails_with_one_clear_message() -> None:
    # An LlmfleetError: `llmfleet infra render|diff` prints it as one line and exits 2.
    assert issubclass(MissingUpstreamPolicy, LlmfleetError)
    with pytest.raises(MissingUpstreamPolicy, match=r"chart aws-load-balancer-controller 9\.9\.9: add"):
        load_balancer_controller("9.9.9")
    with pytest.raises(MissingUpstreamPolicy, match=r"chart karpenter 9\.9\.9: add"):
        karpenter_controller(
            version="9.9.9", cluster_name="c", node_role_arn="r", queue_arn="q", region="r", account="a"
        )


def test_an_unresolved_placeholder_is_an_error() -> None:
    with pytest.raises(MissingUpstreamPolicy, match=r"placeholder \$\{AWS::Region\} has no value"):
        upstream.karpenter_controller(PINNED["karpenter"], {"AWS::Partition": "aws"})


@pytest.mark.parametrize("name", ["addons-lb-controller", "karpenter-controller"])
def test_controller_roles_grant_at_least_upstream_and_never_looser(
    resources: list[dict[str, Any]], name: str
) -> None:
    ours = _rendered(resources, name)
    theirs = upstream_controller_policies()[name]
    assert granted_actions(theirs) - granted_actions(ours) == set()
    # Nothing is unconditional on "*" here that upstream scopes.
    assert unscoped_mutations(ours) <= unscoped_mutations(theirs)
    for stmt in theirs["Statement"]:
        if "Condition" in stmt:
            assert stmt["Condition"].keys() <= {
                k
                for s in ours["Statement"]
                if s.get("Sid") == stmt.get("Sid")
                for k in s.get("Condition", {})
            }


def test_load_balancer_controller_has_the_calls_it_makes_by_default(resources: list[dict[str, Any]]) -> None:
    lbc = _rendered(resources, "addons-lb-controller")
    actions = granted_actions(lbc)
    # The WAF/Shield reads the controller makes for every ALB ingress (addons enabled by default).
    assert {
        "wafv2:GetWebACLForResource",
        "waf-regional:GetWebACLForResource",
        "shield:GetSubscriptionState",
        "elasticloadbalancing:DescribeListenerAttributes",
    } <= actions
    # Backend rules go onto the node security groups, which the controller did not create.
    assert {"ec2:AuthorizeSecurityGroupIngress", "ec2:RevokeSecurityGroupIngress"} <= unscoped_mutations(lbc)
    # Deleting a security group stays limited to the ones the controller tagged.
    assert all("Condition" in s for s in _statements(lbc, "ec2:DeleteSecurityGroup"))
    (slr,) = _statements(lbc, "iam:CreateServiceLinkedRole")
    assert slr["Condition"] == {"StringEquals": {"iam:AWSServiceName": "elasticloadbalancing.amazonaws.com"}}


def test_karpenter_reads_reservations_and_profiles_and_tags_after_launch(
    resources: list[dict[str, Any]],
) -> None:
    policy = _rendered(resources, "karpenter-controller")
    actions = granted_actions(policy)
    assert {
        "ec2:DescribeCapacityReservations",
        "ec2:DescribeInstanceStatus",
        "iam:GetInstanceProfile",
        "iam:ListInstanceProfiles",
    } <= actions
    # Tagging after launch (the nodeclaim/Name tags): instances only, of this cluster, those keys only.
    (later,) = [s for s in _statements(policy, "ec2:CreateTags") if "ec2:CreateAction" not in json.dumps(s)]
    assert later["Resource"].endswith(":instance/*")
    assert later["Condition"]["ForAllValues:StringEquals"]["aws:TagKeys"] == [
        "eks:eks-cluster-name",
        "karpenter.sh/nodeclaim",
        "Name",
    ]
    # The node role is passed to EC2 only, and no placeholder is left unresolved.
    (pass_role,) = _statements(policy, "iam:PassRole")
    assert pass_role["Resource"] != "*"
    assert "${" not in json.dumps(policy)


def test_inline_policies_fit_the_iam_quota(resources: list[dict[str, Any]]) -> None:
    per_role: dict[str, int] = {}
    for r in resources:
        if r["type"] == ROLE_POLICY:
            per_role[r["name"]] = per_role.get(r["name"], 0) + len("".join(r["inputs"]["policy"].split()))
    assert per_role
    assert max(per_role.values()) <= INLINE_POLICY_LIMIT, per_role


def test_scoping_allows_only_what_upstream_grants_unconditionally() -> None:
    lbc = upstream_controller_policies()["addons-lb-controller"]
    ingress = {"Effect": "Allow", "Action": ["ec2:AuthorizeSecurityGroupIngress"], "Resource": "*"}
    delete = {"Effect": "Allow", "Action": ["ec2:DeleteSecurityGroup"], "Resource": "*"}
    assert is_scoped({"Statement": [ingress]}, lbc) == []
    assert is_scoped({"Statement": [ingress]}) != []
    assert is_scoped({"Statement": [delete]}, lbc) != []
    assert is_scoped({"Statement": [{**delete, "Action": ["ec2:*"]}]}, lbc) != []


def test_interruption_rules_and_queue_policy_are_upstream_s(resources: list[dict[str, Any]]) -> None:
    template = upstream.karpenter_template(PINNED["karpenter"])["Resources"]
    theirs = {
        json.dumps(r["Properties"]["EventPattern"], sort_keys=True)
        for r in template.values()
        if r["Type"] == "AWS::Events::Rule"
    }
    ours = {
        r["inputs"]["eventPattern"]
        for r in resources
        if r["type"] == "aws:cloudwatch/eventRule:EventRule" and r["parent"] == "llmfleet:infra:Karpenter"
    }
    assert ours == theirs
    queue = next(r["inputs"] for r in resources if r["type"] == "aws:sqs/queue:Queue")
    upstream_queue = template["KarpenterInterruptionQueue"]["Properties"]
    assert queue["messageRetentionSeconds"] == upstream_queue["MessageRetentionPeriod"]
    assert queue["sqsManagedSseEnabled"] is upstream_queue["SqsManagedSseEnabled"]
    policy = json.loads(
        next(r["inputs"]["policy"] for r in resources if r["type"] == "aws:sqs/queuePolicy:QueuePolicy")
    )
    arn = policy["Statement"][0]["Resource"]
    expected = template["KarpenterInterruptionQueuePolicy"]["Properties"]["PolicyDocument"]["Statement"]
    resolved = json.loads(json.dumps(expected).replace('"KarpenterInterruptionQueue.Arn"', json.dumps(arn)))
    assert policy["Statement"] == resolved
