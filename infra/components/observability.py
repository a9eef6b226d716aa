"""Observability: ServiceMonitors, the rules and alerts, the Grafana dashboards, the drift CronJob."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from apps.core.sizing.plan import FleetPlan
from apps.core.spec import StackSpec
from infra.components.kube import KubeObject
from infra.config import OfficeHours
from infra.manifests.dashboards import dashboard_config_maps
from infra.manifests.monitoring import prometheus_rule, service_monitors
from infra.manifests.ops import drift_cron_job


@dataclass(frozen=True)
class ObservabilityArgs:
    spec: StackSpec
    plan: FleetPlan
    office_hours: OfficeHours
    ops_image: pulumi.Input[str]
    provider: pulumi.ProviderResource
    depends_on: list[pulumi.Resource]


class Observability(pulumi.ComponentResource):
    def __init__(
        self, name: str, args: ObservabilityArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("llmfleet:infra:Observability", name, None, opts)
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=args.depends_on)
        objects = [
            *service_monitors(),
            prometheus_rule(args.spec, args.plan, args.office_hours),
            *dashboard_config_maps(args.spec),
        ]
        for obj in objects:
            KubeObject(obj, k8s_opts)
        cron = drift_cron_job(args.spec.name, "")
        # The gateway image carries the whole wheel, so it runs `llmfleet ops drift` too.
        cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["image"] = args.ops_image
        KubeObject(cron, k8s_opts)
        self.register_outputs({})
