"""Cluster add-ons from Helm: NVIDIA device plugin (the AL2023 NVIDIA AMI does not ship it),
DCGM exporter, KEDA, kube-prometheus-stack (Prometheus operator CRDs) and the AWS Load
Balancer Controller (IRSA) that turns the ingresses into an ALB."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra.components.irsa import irsa_role
from infra.components.kube import KubeObject
from infra.manifests.common import GPU_TAINT, MONITORING_NAMESPACE, NAMESPACE, labels
from infra.manifests.iam import load_balancer_controller

GPU_TOLERATION = {"key": GPU_TAINT["key"], "operator": "Exists", "effect": GPU_TAINT["effect"]}
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


class Addons(pulumi.ComponentResource):
    def __init__(self, name: str, args: AddonsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:infra:Addons", name, None, opts)
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=args.provider)
        for namespace in (NAMESPACE, MONITORING_NAMESPACE):
            KubeObject(
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": namespace, "labels": labels(namespace)},
                },
                k8s_opts,
            )
        lbc_role = irsa_role(
            f"{name}-lb-controller",
            oidc_provider_arn=args.oidc_provider_arn,
            oidc_provider_url=args.oidc_provider_url,
            namespace="kube-system",
            service_account="aws-load-balancer-controller",
            policy=load_balancer_controller(args.cluster_name),
            parent=self,
        )
        values: dict[str, dict[str, Any]] = {
            "nvidia-device-plugin": {
                "tolerations": [GPU_TOLERATION],
                "nodeSelector": {"nvidia.com/gpu.present": "true"},
            },
            "dcgm-exporter": {
                "tolerations": [GPU_TOLERATION],
                "nodeSelector": {"nvidia.com/gpu.present": "true"},
                "serviceMonitor": {"enabled": False},  # ours is in the Observability component
            },
            "keda": {"nodeSelector": SYSTEM, "prometheus": {"operator": {"enabled": True}}},
            "kube-prometheus-stack": {
                "prometheus": {"prometheusSpec": {"nodeSelector": SYSTEM, "retention": "15d"}},
                "grafana": {"nodeSelector": SYSTEM},
            },
            "aws-load-balancer-controller": {
                "clusterName": args.cluster_name,
                "region": args.region,
                "vpcId": args.vpc_id,
                "nodeSelector": SYSTEM,
                "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": lbc_role.arn}},
            },
        }
        self.releases: dict[str, k8s.helm.v3.Release] = {}
        for release, (namespace, repo, chart, version) in CHARTS.items():
            self.releases[release] = k8s.helm.v3.Release(
                f"{name}-{release}",
                name=release,
                namespace=namespace,
                create_namespace=namespace == "keda",  # the others exist already
                chart=chart,
                version=version,
                repository_opts={"repo": repo},
                values=values[release],
                opts=k8s_opts,
            )
        self.register_outputs({})
