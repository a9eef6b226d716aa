"""Observability: ServiceMonitors for every component and the SLI alert rules."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from infra.components.kube import KubeObject
from infra.manifests.monitoring import prometheus_rule, service_monitors


@dataclass(frozen=True)
class ObservabilityArgs:
    models_at_zero: list[str]
    provider: pulumi.ProviderResource
    depends_on: list[pulumi.Resource]


class Observability(pulumi.ComponentResource):
    def __init__(
        self, name: str, args: ObservabilityArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("llmfleet:infra:Observability", name, None, opts)
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=args.depends_on)
        for obj in [*service_monitors(), prometheus_rule(args.models_at_zero)]:
            KubeObject(obj, k8s_opts)
        self.register_outputs({})
