"""IAM policy documents (pure dicts): least privilege, every statement scoped.

A statement may use `Resource: "*"` only for read-only describe/list actions (AWS cannot
scope those) or behind a condition on the cluster's tags; tests enforce that rule.
"""

from __future__ import annotations

from typing import Any

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


def model_sync_read(bucket_arn: str) -> Policy:
    """Reads only `models/*`-style objects of the model bucket (the bucket holds nothing else)."""
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
        ],
    }


def karpenter_controller(
    *, cluster_name: str, cluster_arn: str, node_role_arn: str, queue_arn: str, region: str, account: str
) -> Policy:
    tag_condition = {"StringEquals": {f"aws:RequestTag/kubernetes.io/cluster/{cluster_name}": "owned"}}
    resource_tag = {"StringEquals": {f"aws:ResourceTag/kubernetes.io/cluster/{cluster_name}": "owned"}}
    ec2 = f"arn:aws:ec2:{region}"
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ReadOnly",
                "Effect": "Allow",
                "Action": [
                    "ec2:DescribeAvailabilityZones",
                    "ec2:DescribeImages",
                    "ec2:DescribeInstances",
                    "ec2:DescribeInstanceTypeOfferings",
                    "ec2:DescribeInstanceTypes",
                    "ec2:DescribeLaunchTemplates",
                    "ec2:DescribeSecurityGroups",
                    "ec2:DescribeSpotPriceHistory",
                    "ec2:DescribeSubnets",
                    "pricing:GetProducts",
                ],
                "Resource": "*",
            },
            {
                "Sid": "LaunchScopedToCluster",
                "Effect": "Allow",
                "Action": ["ec2:RunInstances", "ec2:CreateFleet", "ec2:CreateLaunchTemplate"],
                "Resource": [
                    f"{ec2}:*:fleet/*",
                    f"{ec2}:*:instance/*",
                    f"{ec2}:*:volume/*",
                    f"{ec2}:*:network-interface/*",
                    f"{ec2}:*:launch-template/*",
                    f"{ec2}:*:spot-instances-request/*",
                ],
                "Condition": tag_condition,
            },
            {
                "Sid": "UseSharedResources",
                "Effect": "Allow",
                "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
                "Resource": [
                    f"{ec2}::image/*",
                    f"{ec2}::snapshot/*",
                    f"{ec2}:{account}:security-group/*",
                    f"{ec2}:{account}:subnet/*",
                    f"{ec2}:{account}:launch-template/*",
                ],
            },
            {
                "Sid": "TagOnCreate",
                "Effect": "Allow",
                "Action": ["ec2:CreateTags"],
                "Resource": [
                    f"{ec2}:*:fleet/*",
                    f"{ec2}:*:instance/*",
                    f"{ec2}:*:volume/*",
                    f"{ec2}:*:launch-template/*",
                ],
                "Condition": tag_condition,
            },
            {
                "Sid": "TerminateOwn",
                "Effect": "Allow",
                "Action": ["ec2:TerminateInstances", "ec2:DeleteLaunchTemplate"],
                "Resource": [f"{ec2}:*:instance/*", f"{ec2}:*:launch-template/*"],
                "Condition": resource_tag,
            },
            {
                "Sid": "PassNodeRole",
                "Effect": "Allow",
                "Action": ["iam:PassRole"],
                "Resource": [node_role_arn],
            },
            {
                "Sid": "InstanceProfiles",
                "Effect": "Allow",
                "Action": [
                    "iam:CreateInstanceProfile",
                    "iam:TagInstanceProfile",
                    "iam:AddRoleToInstanceProfile",
                    "iam:RemoveRoleFromInstanceProfile",
                    "iam:DeleteInstanceProfile",
                    "iam:GetInstanceProfile",
                ],
                "Resource": [f"arn:aws:iam::{account}:instance-profile/*"],
            },
            {
                "Sid": "Interruption",
                "Effect": "Allow",
                "Action": ["sqs:DeleteMessage", "sqs:GetQueueUrl", "sqs:ReceiveMessage"],
                "Resource": [queue_arn],
            },
            {
                "Sid": "Cluster",
                "Effect": "Allow",
                "Action": ["eks:DescribeCluster"],
                "Resource": [cluster_arn],
            },
            {
                "Sid": "AmiParameters",
                "Effect": "Allow",
                "Action": ["ssm:GetParameter"],
                "Resource": [f"arn:aws:ssm:{region}::parameter/aws/service/*"],
            },
        ],
    }


def load_balancer_controller(cluster_name: str) -> Policy:
    """AWS Load Balancer Controller: reads anything, changes only what carries the cluster tag."""
    cluster_tag = {"Null": {"aws:ResourceTag/elbv2.k8s.aws/cluster": "false"}}
    request_tag = {"Null": {"aws:RequestTag/elbv2.k8s.aws/cluster": "false"}}
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ReadOnly",
                "Effect": "Allow",
                "Action": [
                    "ec2:DescribeAccountAttributes",
                    "ec2:DescribeAddresses",
                    "ec2:DescribeAvailabilityZones",
                    "ec2:DescribeInternetGateways",
                    "ec2:DescribeVpcs",
                    "ec2:DescribeSubnets",
                    "ec2:DescribeSecurityGroups",
                    "ec2:DescribeInstances",
                    "ec2:DescribeNetworkInterfaces",
                    "ec2:DescribeTags",
                    "elasticloadbalancing:DescribeLoadBalancers",
                    "elasticloadbalancing:DescribeLoadBalancerAttributes",
                    "elasticloadbalancing:DescribeListeners",
                    "elasticloadbalancing:DescribeListenerCertificates",
                    "elasticloadbalancing:DescribeListenerAttributes",
                    "elasticloadbalancing:DescribeSSLPolicies",
                    "elasticloadbalancing:DescribeRules",
                    "elasticloadbalancing:DescribeTargetGroups",
                    "elasticloadbalancing:DescribeTargetGroupAttributes",
                    "elasticloadbalancing:DescribeTargetHealth",
                    "elasticloadbalancing:DescribeTags",
                    "acm:ListCertificates",
                    "acm:DescribeCertificate",
                ],
                "Resource": "*",
            },
            {
                "Sid": "CreateTagged",
                "Effect": "Allow",
                "Action": [
                    "ec2:CreateSecurityGroup",
                    "elasticloadbalancing:CreateLoadBalancer",
                    "elasticloadbalancing:CreateTargetGroup",
                    "ec2:CreateTags",
                    "elasticloadbalancing:AddTags",
                ],
                "Resource": "*",
                "Condition": request_tag,
            },
            {
                "Sid": "ModifyTagged",
                "Effect": "Allow",
                "Action": [
                    "ec2:AuthorizeSecurityGroupIngress",
                    "ec2:RevokeSecurityGroupIngress",
                    "ec2:DeleteSecurityGroup",
                    "elasticloadbalancing:CreateListener",
                    "elasticloadbalancing:DeleteListener",
                    "elasticloadbalancing:CreateRule",
                    "elasticloadbalancing:DeleteRule",
                    "elasticloadbalancing:ModifyLoadBalancerAttributes",
                    "elasticloadbalancing:SetSecurityGroups",
                    "elasticloadbalancing:SetSubnets",
                    "elasticloadbalancing:DeleteLoadBalancer",
                    "elasticloadbalancing:ModifyTargetGroup",
                    "elasticloadbalancing:ModifyTargetGroupAttributes",
                    "elasticloadbalancing:DeleteTargetGroup",
                    "elasticloadbalancing:RegisterTargets",
                    "elasticloadbalancing:DeregisterTargets",
                    "elasticloadbalancing:ModifyListener",
                    "elasticloadbalancing:AddListenerCertificates",
                    "elasticloadbalancing:RemoveListenerCertificates",
                    "elasticloadbalancing:ModifyRule",
                ],
                "Resource": "*",
                "Condition": cluster_tag,
            },
        ],
    }


def is_scoped(policy: Policy) -> list[str]:
    """Problems of a policy: wildcard actions, or `Resource: "*"` on a mutating action without a condition."""
    problems: list[str] = []
    for index, stmt in enumerate(policy.get("Statement", [])):
        actions = stmt.get("Action", [])
        actions = [actions] if isinstance(actions, str) else actions
        resources = stmt.get("Resource", [])
        resources = [resources] if isinstance(resources, str) else resources
        if any(a == "*" or a.endswith(":*") for a in actions):
            problems.append(f"statement {index}: wildcard action {actions}")
        read_only = all(a.split(":", 1)[1].startswith(("Describe", "List", "Get")) for a in actions)
        if "*" in resources and not read_only and "Condition" not in stmt:
            problems.append(f"statement {index}: Resource '*' for {actions} without a condition")
    return problems
