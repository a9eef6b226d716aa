"""The EKS cluster `inference-<stack>` (pulumi-eks), its `system` managed node group (m6i) for the
gateway, orchestrator, KEDA and Prometheus, the OIDC provider for IRSA and the Kubernetes
provider every in-cluster object uses."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
import pulumi_eks as eks
import pulumi_kubernetes as k8s

from infra.manifests.iam import assume_role_by_service

NODE_POLICIES = (
    "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
    "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy",
    "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly",
    "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore",
)


@dataclass(frozen=True)
class ClusterArgs:
    name: str
    version: str
    vpc_id: pulumi.Input[str]
    private_subnet_ids: pulumi.Input[Sequence[pulumi.Input[str]]]
    public_subnet_ids: pulumi.Input[Sequence[pulumi.Input[str]]]
    system_instance_type: str
    system_min: int
    system_desired: int
    system_max: int


def node_role(name: str, parent: pulumi.Resource, role_name: str | None = None) -> aws.iam.Role:
    child = pulumi.ResourceOptions(parent=parent)
    role = aws.iam.Role(
        name,
        name=role_name,
        assume_role_policy=json.dumps(assume_role_by_service("ec2.amazonaws.com")),
        opts=child,
    )
    for arn in NODE_POLICIES:
        aws.iam.RolePolicyAttachment(
            f"{name}-{arn.rsplit('/', 1)[1]}", role=role.name, policy_arn=arn, opts=child
        )
    return role


class Cluster(pulumi.ComponentResource):
    def __init__(self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:infra:Cluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.name = args.name
        self.cluster = eks.Cluster(
            name,
            name=args.name,
            version=args.version,
            vpc_id=args.vpc_id,
            private_subnet_ids=args.private_subnet_ids,
            public_subnet_ids=args.public_subnet_ids,
            node_associate_public_ip_address=False,
            endpoint_private_access=True,
            endpoint_public_access=True,
            authentication_mode=eks.AuthenticationMode.API,
            skip_default_node_group=True,
            create_oidc_provider=True,
            # No pulumi-eks node groups: use the EKS-created cluster security group for everything
            # (the managed node group sits in it; it admits all traffic from itself).
            skip_default_security_groups=True,
            tags={"karpenter.sh/discovery": args.name},
            # The VPC CNI enforces NetworkPolicy only with its network policy agent enabled;
            # without it every NetworkPolicy the platform renders is accepted and ignored.
            vpc_cni_options=eks.VpcCniOptionsArgs(enable_network_policy=True),
            opts=child,
        )
        # Cluster tags do not reach the cluster security group (EKS TagResource API); Karpenter's
        # EC2NodeClass selects security groups by this tag, so GPU nodes join the same group as
        # the system nodes and the two reach each other (sec-group-reqs.html).
        self.discovery_tag = aws.ec2.Tag(
            f"{name}-cluster-sg-discovery",
            resource_id=self.cluster.cluster_security_group_id,
            key="karpenter.sh/discovery",
            value=args.name,
            opts=child,
        )
        system_role = node_role(f"{name}-system-node", self)
        self.system_nodes = aws.eks.NodeGroup(
            f"{name}-system",
            cluster_name=args.name,
            node_group_name="system",
            node_role_arn=system_role.arn,
            subnet_ids=args.private_subnet_ids,
            instance_types=[args.system_instance_type],
            ami_type="AL2023_x86_64_STANDARD",
            capacity_type="ON_DEMAND",
            scaling_config={
                "min_size": args.system_min,
                "desired_size": args.system_desired,
                "max_size": args.system_max,
            },
            labels={"llmfleet.io/pool": "system"},
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.cluster]),
        )
        self.oidc_provider_arn = self.cluster.oidc_provider_arn
        self.oidc_provider_url = self.cluster.oidc_provider_url
        self.cluster_security_group_id = self.cluster.cluster_security_group_id
        # What every in-cluster release needs first: the API, the system nodes, the SG tag.
        self.ready: list[pulumi.Resource] = [self.cluster, self.system_nodes, self.discovery_tag]
        self.provider = k8s.Provider(
            f"{name}-k8s",
            kubeconfig=self.cluster.kubeconfig_json,
            enable_server_side_apply=True,
            opts=child,
        )
        self.register_outputs(
            {"kubeconfig": self.cluster.kubeconfig_json, "oidc_provider_arn": self.oidc_provider_arn}
        )
