"""Cluster add-ons from Helm: NVIDIA device plugin (the AL2023 NVIDIA AMI does not ship it),
DCGM exporter, KEDA, kube-prometheus-stack (Prometheus operator CRDs) and the AWS Load
Balancer Controller (IRSA) that turns the ingresses into an ALB."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s
import pulumi_random as random

from infra.components.irsa import irsa_role
from infra.components.kube import KubeObject
from infra.manifests.common import (
    GPU_PRESENT_LABEL,
    GPU_TAINT,
    MONITORING_NAMESPACE,
    NAMESPACE,
    SPOT_TAINT_KEY,
    labels,
)
from infra.manifests.iam import assume_role_with_oidc, load_balancer_controller

# GPU DaemonSets run on every GPU pool: the GPU taint and the spot pool's extra taint.
GPU_TOLERATIONS = [
    {"key": GPU_TAINT["key"], "operator": "Exists", "effect": GPU_TAINT["effect"]},
    {"key": SPOT_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"},
]
GRAFANA_ADMIN_SECRET = "grafana-admin"
# Helm's 300 s default is shorter than a first install on fresh nodes (image pulls, the EBS
# volume, webhook certificates): a release that is still converging would be marked failed.
HELM_TIMEOUT_S = 900
STORAGE_CLASS = "gp3"
EBS_CSI_POLICY = "arn:aws:iam::aws:policy/service-role/AmazonEBSCSIDriverPolicy"
SYSTEM = {"llmfleet.io/pool": "system"}
CHARTS: dict[str, tuple[str, str, str, str]] = {
    # release: (namespace, repository, chart, version)
    "nvidia-device-plugin": (
        "kube-system",
        "https://nvidia.github.io/k8s-device-plugin",
        "nvidia-device-plugin",
        "0.17.1",
    ),
    "dcgm-exporter": (
        MONITORING_NAMESPACE,
        "https://nvidia.github.io/dcgm-exporter/helm-charts",
        "dcgm-exporter",
        "4.5.2",
    ),
    "keda": ("keda", "https://kedacore.github.io/charts", "keda", "2.20.2"),
    "kube-prometheus-stack": (
        MONITORING_NAMESPACE,
        "https://prometheus-community.github.io/helm-charts",
        "kube-prometheus-stack",
        "79.5.0",
    ),
    "aws-load-balancer-controller": (
        "kube-system",
        "https://aws.github.io/eks-charts",
        "aws-load-balancer-controller",
        "1.14.0",
    ),
}


@dataclass(frozen=True)
class AddonsArgs:
    cluster_name: str
    region: str
    vpc_id: pulumi.Input[str]
    oidc_provider_arn: pulumi.Input[str]
    oidc_provider_url: pulumi.Input[str]
    provider: pulumi.ProviderResource
    # The cluster and its system node group: every release's pods run there.
    depends_on: list[pulumi.Resource] = field(default_factory=list)


def _ebs_csi(name: str, args: AddonsArgs, parent: pulumi.Resource) -> aws.eks.Addon:
    """EBS CSI driver (Prometheus' persistent volume) with its IRSA role and AWS's managed policy."""
    child = pulumi.ResourceOptions(parent=parent)
    trust = pulumi.Output.all(args.oidc_provider_arn, args.oidc_provider_url).apply(
        lambda v: json.dumps(
            assume_role_with_oidc(str(v[0]), str(v[1]), "kube-system", "ebs-csi-controller-sa")
        )
    )
    role = aws.iam.Role(f"{name}-ebs-csi", assume_role_policy=trust, opts=child)
    aws.iam.RolePolicyAttachment(f"{name}-ebs-csi", role=role.name, policy_arn=EBS_CSI_POLICY, opts=child)
    return aws.eks.Addon(
        f"{name}-ebs-csi",
        cluster_name=args.cluster_name,
        addon_name="aws-ebs-csi-driver",
        service_account_role_arn=role.arn,
        opts=pulumi.ResourceOptions(parent=parent, depends_on=args.depends_on),
    )


def _monitoring_values(system: dict[str, str]) -> dict[str, Any]:
    storage = {
        "volumeClaimTemplate": {
            "spec": {
                "storageClassName": STORAGE_CLASS,
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "100Gi"}},
            }
        }
    }
    return {
        # prometheusSpec.storageSpec: without it the TSDB is an emptyDir (weekly SLIs die on restart).
        "prometheus": {
            "prometheusSpec": {"nodeSelector": system, "retention": "15d", "storageSpec": storage}
        },
        # grafana chart values.yaml: admin.existingSecret with userKey/passwordKey.
        "grafana": {
            "nodeSelector": system,
            "admin": {
                "existingSecret": GRAFANA_ADMIN_SECRET,
                "userKey": "admin-user",
                "passwordKey": "admin-password",
            },
        },
    }


class Addons(pulumi.ComponentResource):
    def __init__(self, name: str, args: AddonsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:infra:Addons", name, None, opts)
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=args.depends_on)
        self.namespaces: list[pulumi.Resource] = []
        for namespace in (NAMESPACE, MONITORING_NAMESPACE):
            ns = KubeObject(
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": namespace, "labels": labels(namespace)},
                },
                k8s_opts,
            )
            self.namespaces.append(ns)
        ebs = _ebs_csi(name, args, self)
        # The resource metrics API (metrics.k8s.io) the gateway's CPU HPA reads; EKS does not
        # install it. An EKS community add-on (docs.aws.amazon.com/eks/latest/userguide/metrics-server.html).
        self.metrics_server = aws.eks.Addon(
            f"{name}-metrics-server",
            cluster_name=args.cluster_name,
            addon_name="metrics-server",
            opts=pulumi.ResourceOptions(parent=self, depends_on=args.depends_on),
        )
        storage_class = KubeObject(
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass",
                "metadata": {"name": STORAGE_CLASS, "labels": labels("storage")},
                "provisioner": "ebs.csi.aws.com",
                "parameters": {"type": "gp3", "encrypted": "true"},
                "volumeBindingMode": "WaitForFirstConsumer",
                # Delete: a destroyed stack leaves no orphaned EBS volume behind (Prometheus data
                # is rebuilt by scraping; the SLI history it loses is 15 days at most).
                "reclaimPolicy": "Delete",
            },
            pulumi.ResourceOptions.merge(k8s_opts, pulumi.ResourceOptions(depends_on=[ebs])),
        )
        grafana_password = random.RandomPassword(
            f"{name}-grafana-admin", length=32, special=False, opts=pulumi.ResourceOptions(parent=self)
        )
        grafana_secret = KubeObject(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": GRAFANA_ADMIN_SECRET,
                    "namespace": MONITORING_NAMESPACE,
                    "labels": labels("grafana"),
                },
                "type": "Opaque",
                "stringData": pulumi.Output.secret(
                    grafana_password.result.apply(lambda p: {"admin-user": "admin", "admin-password": p})
                ),
            },
            pulumi.ResourceOptions.merge(k8s_opts, pulumi.ResourceOptions(depends_on=self.namespaces)),
        )
        lbc_role = irsa_role(
            f"{name}-lb-controller",
            oidc_provider_arn=args.oidc_provider_arn,
            oidc_provider_url=args.oidc_provider_url,
            namespace="kube-system",
            service_account="aws-load-balancer-controller",
            policy=load_balancer_controller(CHARTS["aws-load-balancer-controller"][3]),
            parent=self,
        )
        values: dict[str, dict[str, Any]] = {
            "nvidia-device-plugin": {
                "tolerations": GPU_TOLERATIONS,
                "nodeSelector": {GPU_PRESENT_LABEL: "true"},
            },
            "dcgm-exporter": {
                "tolerations": GPU_TOLERATIONS,
                "nodeSelector": {GPU_PRESENT_LABEL: "true"},
                "serviceMonitor": {"enabled": False},  # ours is in the Observability component
            },
            "keda": {"nodeSelector": SYSTEM, "prometheus": {"operator": {"enabled": True}}},
            "kube-prometheus-stack": _monitoring_values(SYSTEM),
            "aws-load-balancer-controller": {
                # Off: its Service mutating webhook (failurePolicy Fail) rejects every new Service
                # until the controller's pods are ready, while Karpenter, KEDA, Prometheus and DCGM
                # create Services in parallel (upstream issue 4140); it only makes this controller
                # the default for `type: LoadBalancer` Services, and we have none (ALB ingresses).
                "enableServiceMutatorWebhook": False,
                "clusterName": args.cluster_name,
                "region": args.region,
                "vpcId": args.vpc_id,
                "nodeSelector": SYSTEM,
                "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": lbc_role.arn}},
            },
        }
        self.releases: dict[str, k8s.helm.v3.Release] = {}
        needs = {"kube-prometheus-stack": [storage_class, grafana_secret]}
        for release, (namespace, repo, chart, version) in CHARTS.items():
            opts = pulumi.ResourceOptions(depends_on=[*self.namespaces, *needs.get(release, [])])
            self.releases[release] = k8s.helm.v3.Release(
                f"{name}-{release}",
                name=release,
                namespace=namespace,
                create_namespace=namespace == "keda",  # the others exist already
                chart=chart,
                version=version,
                repository_opts={"repo": repo},
                values=values[release],
                timeout=HELM_TIMEOUT_S,
                opts=pulumi.ResourceOptions.merge(k8s_opts, opts),
            )
        self.register_outputs({})
