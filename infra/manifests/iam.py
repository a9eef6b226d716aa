"""IAM policy documents (pure dicts): least privilege, every statement scoped.

A statement may use `Resource: "*"` only for read-only describe/list actions (AWS cannot
scope those), behind a condition on the cluster's tags, or where the controller's upstream
policy for the pinned chart grants that action unconditionally; tests enforce that rule. The
controller policies come from the upstream documents in `infra/policies/`.
"""

from __future__ import annotations

from typing import Any

from infra.policies import upstream

Policy = dict[str, Any]


def assume_role_with_oidc(
    oidc_provider_arn: str, oidc_issuer: str, namespace: str, service_account: str
) -> Policy:
    """IRSA trust: only this one service account of this cluster may assume the role."""
    issuer = oidc_issuer.removeprefix("https://")
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Federated": oidc_provider_arn},
                "Action": "sts:AssumeRoleWithWebIdentity",
                "Condition": {
                    "StringEquals": {
                        f"{issuer}:sub": f"system:serviceaccount:{namespace}:{service_account}",
                        f"{issuer}:aud": "sts.amazonaws.com",
                    }
                },
            }
        ],
    }


def assume_role_by_service(service: str) -> Policy:
    return {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}],
    }


def model_sync_read(bucket_arn: str, signing_key_arn: str) -> Policy:
    """Reads only `models/*`-style objects of the model bucket (the bucket holds nothing else) and
    verifies manifests with the model-signing key: `kms:Verify`, never `kms:Sign`."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "ListModels", "Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": [bucket_arn]},
            {
                "Sid": "ReadModels",
                "Effect": "Allow",
                "Action": ["s3:GetObject"],
                "Resource": [f"{bucket_arn}/*"],
            },
            {
                "Sid": "VerifyManifests",
                "Effect": "Allow",
                "Action": ["kms:Verify"],
                "Resource": [signing_key_arn],
            },
        ],
    }


def karpenter_controller(
    *, version: str, cluster_name: str, node_role_arn: str, queue_arn: str, region: str, account: str
) -> Policy:
    """Karpenter's controller policy for chart `version`, built from the upstream template's policies."""
    return upstream.karpenter_controller(
        version,
        {
            "AWS::Partition": "aws",
            "AWS::Region": region,
            "AWS::AccountId": account,
            "ClusterName": cluster_name,
            "KarpenterNodeRole.Arn": node_role_arn,
            "KarpenterInterruptionQueue.Arn": queue_arn,
        },
    )


def load_balancer_controller(version: str) -> Policy:
    """AWS Load Balancer Controller: upstream's policy for chart `version` (it scopes by the cluster tag)."""
    return upstream.load_balancer_controller(version)


def _listed(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _read_only(action: str) -> bool:
    return action.split(":", 1)[1].startswith(("Describe", "List", "Get"))


def _unscoped(stmt: Policy) -> bool:
    return "*" in _listed(stmt.get("Resource")) and "Condition" not in stmt


def unscoped_mutations(policy: Policy) -> set[str]:
    """Mutating actions a policy grants on `Resource: "*"` with no condition."""
    return {
        action
        for stmt in policy.get("Statement", [])
        if stmt.get("Effect") == "Allow" and _unscoped(stmt)
        for action in _listed(stmt.get("Action"))
        if not _read_only(action)
    }


def granted_actions(policy: Policy) -> set[str]:
    return {
        a for s in policy.get("Statement", []) if s.get("Effect") == "Allow" for a in _listed(s.get("Action"))
    }


def is_scoped(policy: Policy, upstream_policy: Policy | None = None) -> list[str]:
    """Problems of a policy: wildcard actions, or `Resource: "*"` on a mutating action without a
    condition unless the controller's upstream policy grants that very action the same way (the
    AWS Load Balancer Controller edits backend rules on security groups it did not create)."""
    allowed = unscoped_mutations(upstream_policy) if upstream_policy else set()
    problems: list[str] = []
    for index, stmt in enumerate(policy.get("Statement", [])):
        actions = _listed(stmt.get("Action"))
        if any(a == "*" or a.endswith(":*") for a in actions):
            problems.append(f"statement {index}: wildcard action {actions}")
        if _unscoped(stmt):
            loose = [a for a in actions if not _read_only(a) and a not in allowed]
            if loose:
                problems.append(f"statement {index}: Resource '*' for {loose} without a condition")
    return problems
