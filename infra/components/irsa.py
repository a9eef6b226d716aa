"""IRSA roles: an IAM role that exactly one Kubernetes service account may assume."""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pulumi_aws as aws

from infra.manifests.iam import assume_role_with_oidc


def irsa_role(
    name: str,
    *,
    oidc_provider_arn: pulumi.Input[str],
    oidc_provider_url: pulumi.Input[str],
    namespace: str,
    service_account: str,
    policy: pulumi.Input[dict[str, Any]],
    parent: pulumi.Resource,
) -> aws.iam.Role:
    child = pulumi.ResourceOptions(parent=parent)
    trust = pulumi.Output.all(oidc_provider_arn, oidc_provider_url).apply(
        lambda v: json.dumps(assume_role_with_oidc(str(v[0]), str(v[1]), namespace, service_account))
    )
    role = aws.iam.Role(name, assume_role_policy=trust, opts=child)
    aws.iam.RolePolicy(
        name, role=role.id, policy=pulumi.Output.from_input(policy).apply(lambda p: json.dumps(p)), opts=child
    )
    return role
