"""Karpenter: controller role (IRSA), node role and access entry, the interruption queue with
its EventBridge rules, the Helm release, and the EC2NodeClass/NodePools from the stack spec."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.components.addons import HELM_TIMEOUT_S
from infra.components.cluster import node_role
from infra.components.irsa import irsa_role
from infra.components.kube import KubeObject
from infra.manifests import karpenter as manifests
from infra.manifests.iam import karpenter_controller

KARPENTER_VERSION = "1.14.1"
# The upstream getting-started template's EventBridge rules and queue policy (infra/policies/karpenter-*).
INTERRUPTION_EVENTS = {
    "spot-interruption": {"source": ["aws.ec2"], "detail-type": ["EC2 Spot Instance Interruption Warning"]},
    "rebalance": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance Rebalance Recommendation"]},
    "state-change": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance State-change Notification"]},
    "scheduled-change": {"source": ["aws.health"], "detail-type": ["AWS Health Event"]},
    "capacity-reservation-interruption": {
        "source": ["aws.ec2"],
        "detail-type": ["EC2 Capacity Reservation Instance Interruption Warning"],
    },
}


@dataclass(frozen=True)
class KarpenterArgs:
    cluster_name: str
    region: str
    account_id: pulumi.Input[str]
    oidc_provider_arn: pulumi.Input[str]
    oidc_provider_url: pulumi.Input[str]
    provider: pulumi.ProviderResource
    pools: manifests.GpuPoolSpec
    ami_alias: str
    # The cluster and its system node group: the access entry names the cluster, the
    # controller's pods run on the system nodes.
    depends_on: list[pulumi.Resource]
    # "create": this stack creates the account's EC2 Spot service-linked role; "exists": the
    # account has it (another stack or an earlier spot request made it; one per account).
    spot_service_linked_role: str = "create"


class Karpenter(pulumi.ComponentResource):
    def __init__(self, name: str, args: KarpenterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:infra:Karpenter", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        # The EC2NodeClass names this role, so its name is fixed rather than generated.
        node_role_name = f"{args.cluster_name}-karpenter-node"
        self.node_role = node_role(f"{name}-node", self, role_name=node_role_name)
        aws.eks.AccessEntry(
            f"{name}-node",
            cluster_name=args.cluster_name,
            principal_arn=self.node_role.arn,
            type="EC2_LINUX",
            opts=pulumi.ResourceOptions(parent=self, depends_on=args.depends_on),
        )
        queue = aws.sqs.Queue(
            f"{name}-interruption",
            name=f"{args.cluster_name}-karpenter",
            message_retention_seconds=300,
            sqs_managed_sse_enabled=True,
            opts=child,
        )
        aws.sqs.QueuePolicy(
            f"{name}-interruption",
            queue_url=queue.url,
            policy=queue.arn.apply(
                lambda arn: json.dumps(
                    {
                        "Version": "2012-10-17",
                        "Statement": [
                            {
                                "Effect": "Allow",
                                "Principal": {"Service": ["events.amazonaws.com", "sqs.amazonaws.com"]},
                                "Action": "sqs:SendMessage",
                                "Resource": arn,
                            },
                            {
                                "Sid": "DenyHTTP",
                                "Effect": "Deny",
                                "Action": "sqs:*",
                                "Resource": arn,
                                "Condition": {"Bool": {"aws:SecureTransport": False}},
                                "Principal": "*",
                            },
                        ],
                    }
                )
            ),
            opts=child,
        )
        for rule_name, pattern in INTERRUPTION_EVENTS.items():
            rule = aws.cloudwatch.EventRule(
                f"{name}-{rule_name}", event_pattern=json.dumps(pattern, sort_keys=True), opts=child
            )
            aws.cloudwatch.EventTarget(f"{name}-{rule_name}", rule=rule.name, arn=queue.arn, opts=child)
        # Upstream's controller policy for the pinned chart (infra/policies), resolved for this cluster.
        policy = pulumi.Output.all(self.node_role.arn, queue.arn, args.account_id).apply(
            lambda v: karpenter_controller(
                version=KARPENTER_VERSION,
                cluster_name=args.cluster_name,
                node_role_arn=str(v[0]),
                queue_arn=str(v[1]),
                region=args.region,
                account=str(v[2]),
            )
        )
        controller = irsa_role(
            f"{name}-controller",
            oidc_provider_arn=args.oidc_provider_arn,
            oidc_provider_url=args.oidc_provider_url,
            namespace="kube-system",
            service_account="karpenter",
            policy=policy,
            parent=self,
        )
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=args.depends_on)
        release = k8s.helm.v3.Release(
            f"{name}-helm",
            name="karpenter",
            namespace="kube-system",
            chart="oci://public.ecr.aws/karpenter/karpenter",
            version=KARPENTER_VERSION,
            values={
                "settings": {"clusterName": args.cluster_name, "interruptionQueue": queue.name},
                "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": controller.arn}},
                "nodeSelector": {"llmfleet.io/pool": "system"},
                "replicas": 2,
            },
            timeout=HELM_TIMEOUT_S,
            opts=k8s_opts,
        )
        after_helm = pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=[release])
        self.node_class = KubeObject(
            manifests.ec2_node_class(
                cluster_name=args.cluster_name, node_role_name=node_role_name, ami_alias=args.ami_alias
            ),
            after_helm,
        )
        # Spot launches need the account's service-linked role: the pools wait for it.
        spot_role = (
            _spot_service_linked_role(name, args.spot_service_linked_role, self)
            if args.pools.spot_model is not None
            else None
        )
        pool_opts = pulumi.ResourceOptions.merge(
            after_helm, pulumi.ResourceOptions(depends_on=[spot_role] if spot_role else [])
        )
        for pool in manifests.node_pools(args.pools):
            KubeObject(pool, pool_opts)
        self.register_outputs({"queue": queue.name})


# EC2 launches spot capacity through CreateFleet only when the account has this role; EC2 makes
# it by itself only for a console request, and Karpenter's policy may not create it.
SPOT_SERVICE = "spot.amazonaws.com"
SPOT_ROLE_NAME = "AWSServiceRoleForEC2Spot"


def _spot_service_linked_role(name: str, mode: str, parent: pulumi.Resource) -> pulumi.Resource | None:
    if mode == "create":
        return aws.iam.ServiceLinkedRole(
            f"{name}-spot", aws_service_name=SPOT_SERVICE, opts=pulumi.ResourceOptions(parent=parent)
        )
    if mode == "exists":
        # Fails `pulumi preview` with "role not found" when the account lacks it.
        aws.iam.get_role_output(name=SPOT_ROLE_NAME, opts=pulumi.InvokeOutputOptions(parent=parent))
        return None
    raise ValueError(f"llmfleet:spotServiceLinkedRole must be 'create' or 'exists', not {mode!r}")
