"""Platform apps: gateway and orchestrator with their Secret, Services, PDBs, HPA and ALB
ingresses (public API with TLS; the orchestrator's node WebSocket for on-premises servers)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import pulumi
import pulumi_random as random

from infra.components.kube import KubeObject
from infra.manifests.common import Manifest, meta
from infra.manifests.netpol import network_policies
from infra.manifests.node_agent import NODE_POOL, NODE_TOKEN_SECRET
from infra.manifests.platform import (
    APP_SECRET,
    APP_SECRET_FIELDS,
    NodePoolRegistration,
    PlatformTarget,
    app_secret_key,
    migrate_job,
    platform_objects,
)


@dataclass(frozen=True)
class PlatformArgs:
    target: PlatformTarget
    gateway_image: pulumi.Input[str]
    orchestrator_image: pulumi.Input[str]
    database_url: pulumi.Input[str]
    redis_url: pulumi.Input[str]
    provider: pulumi.ProviderResource
    depends_on: list[pulumi.Resource]


class PlatformApps(pulumi.ComponentResource):
    def __init__(self, name: str, args: PlatformArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:infra:PlatformApps", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=args.depends_on)
        internal_token = random.RandomPassword(f"{name}-internal-token", length=48, special=False, opts=child)
        secret_key = random.RandomPassword(f"{name}-secret-key", length=64, special=False, opts=child)
        cloud_node_token = random.RandomPassword(
            f"{name}-cloud-node-token", length=48, special=False, opts=child
        )
        secret: Manifest = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta(APP_SECRET, "llmfleet"),
            "type": "Opaque",
            "stringData": pulumi.Output.secret(
                # In the order of APP_SECRET_FIELDS: database_url, redis_url, internal_token, secret_key.
                pulumi.Output.all(
                    args.database_url, args.redis_url, internal_token.result, secret_key.result
                ).apply(lambda v: {app_secret_key(f): v[i] for i, f in enumerate(APP_SECRET_FIELDS)})
            ),
        }
        KubeObject(secret, k8s_opts)
        node_token: Manifest = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta(NODE_TOKEN_SECRET, "vllm"),
            "type": "Opaque",
            "stringData": pulumi.Output.secret(cloud_node_token.result.apply(lambda t: {"token": t})),
        }
        KubeObject(node_token, k8s_opts)
        job = migrate_job("", args.target.stack, NodePoolRegistration(NODE_POOL, NODE_TOKEN_SECRET))
        pod = job["spec"]["template"]
        for container in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]:
            container["image"] = args.gateway_image
        # The Job reads the token through a secretKeyRef, so a rotated token would not change its
        # spec: this digest does, and Pulumi replaces (re-runs) the Job to store the new hash.
        pod["metadata"]["annotations"] = {
            "llmfleet.io/node-token-sha256": cloud_node_token.result.apply(
                lambda t: hashlib.sha256(t.encode()).hexdigest()
            )
        }
        migrate = KubeObject(job, k8s_opts)
        # The apps roll out only after the schema is current.
        after_migrate = pulumi.ResourceOptions.merge(k8s_opts, pulumi.ResourceOptions(depends_on=[migrate]))
        for obj in platform_objects(args.target):
            if obj["kind"] == "Deployment":
                container = obj["spec"]["template"]["spec"]["containers"][0]
                container["image"] = (
                    args.gateway_image if container["name"] == "gateway" else args.orchestrator_image
                )
            KubeObject(obj, after_migrate if obj["kind"] == "Deployment" else k8s_opts)
        for policy in network_policies():
            KubeObject(policy, k8s_opts)
        self.register_outputs({})
