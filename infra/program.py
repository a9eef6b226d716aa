"""The Pulumi program: the stack spec and the planner in, every component out.

`define(spec, config)` is called by `__main__.py` under `pulumi up` and by `infra.render`
under mocks; it creates no resource inside an `apply`.
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from apps.core.sizing.plan import plan_fleet
from apps.core.spec import StackSpec, load_spec
from infra.amis import check_alias
from infra.components.addons import Addons, AddonsArgs
from infra.components.artifacts import ArtifactsArgs, Images, ModelBucket
from infra.components.cluster import Cluster, ClusterArgs
from infra.components.datastores import Cache, Database, DatastoreArgs
from infra.components.karpenter import Karpenter, KarpenterArgs
from infra.components.network import Network, NetworkArgs
from infra.components.observability import Observability, ObservabilityArgs
from infra.components.platform import PlatformApps, PlatformArgs
from infra.components.serving import ModelServing, ServingArgs
from infra.config import InfraConfig
from infra.manifests.karpenter import gpu_pool_spec
from infra.manifests.platform import PlatformTarget


def define(config: InfraConfig, spec: StackSpec | None = None) -> None:
    spec = spec or load_spec(config.stack)
    # No GPU node could launch with an AMI release that has no AMIs for this Kubernetes version.
    check_alias(config.ami_alias, spec.kubernetes_version)
    plan = plan_fleet(spec)
    # Account-wide names carry the Pulumi stack: two stacks in one account must not collide.
    name = f"{spec.cluster_name}-{config.deployment_name}"
    network, cluster, addons = _kubernetes(config, spec, name)
    bucket, images, database, cache = _stores(config, spec, network)
    # The KEDA and Prometheus-operator CRDs, and the namespaces our objects live in.
    crds: list[pulumi.Resource] = [
        addons.releases["keda"],
        addons.releases["kube-prometheus-stack"],
        *addons.namespaces,
    ]
    ModelServing(
        "serving",
        ServingArgs(
            spec=spec,
            plan=plan,
            vllm_image=images.refs["vllm"],
            agent_image=images.refs["agent"],
            model_sync_image=images.refs["modelsync"],
            model_bucket=bucket.bucket.bucket,
            model_bucket_arn=bucket.bucket.arn,
            model_signing_key_arn=bucket.signing_key.arn,
            oidc_provider_arn=cluster.oidc_provider_arn,
            oidc_provider_url=cluster.oidc_provider_url,
            office_hours=config.office_hours,
            scale_models=config.scale_models,
            provider=cluster.provider,
            depends_on=crds,
        ),
    )
    _platform_apps(config, spec, cluster, addons, images, database, cache)
    Observability(
        "observability",
        ObservabilityArgs(
            spec=spec,
            plan=plan,
            office_hours=config.office_hours,
            ops_image=images.refs["gateway"],
            provider=cluster.provider,
            depends_on=[addons.releases["kube-prometheus-stack"], *addons.namespaces],
        ),
    )
    pulumi.export("cluster", name)
    pulumi.export("kubeconfig", pulumi.Output.secret(cluster.cluster.kubeconfig_json))
    pulumi.export("model_bucket", bucket.bucket.bucket)
    pulumi.export("model_signing_key", bucket.signing_alias.name)  # `llmfleet model publish --kms-key-id`
    pulumi.export("gpus_peak", plan.gpus_peak)
    pulumi.export("gpus_cloud", plan.gpus_cloud)


def _kubernetes(config: InfraConfig, spec: StackSpec, name: str) -> tuple[Network, Cluster, Addons]:
    """The VPC, the EKS cluster, Karpenter's GPU pools and the cluster add-ons."""
    account_id = aws.get_caller_identity_output().account_id
    network = Network(
        "network",
        NetworkArgs(
            name, config.vpc_cidr, config.availability_zones, config.region, config.single_nat_gateway
        ),
    )
    cluster = Cluster(
        spec.cluster_name,  # the logical name; the physical one carries the stack
        ClusterArgs(
            name=name,
            version=spec.kubernetes_version,
            vpc_id=network.vpc.id,
            private_subnet_ids=network.private_subnet_ids,
            public_subnet_ids=network.public_subnet_ids,
            system_instance_type=config.system_instance_type,
            system_min=config.system_nodes_min,
            system_desired=config.system_nodes_desired,
            system_max=config.system_nodes_max,
        ),
    )
    Karpenter(
        "karpenter",
        KarpenterArgs(
            cluster_name=name,
            region=config.region,
            account_id=account_id,
            oidc_provider_arn=cluster.oidc_provider_arn,
            oidc_provider_url=cluster.oidc_provider_url,
            provider=cluster.provider,
            pools=gpu_pool_spec(spec),
            ami_alias=config.ami_alias,
            spot_service_linked_role=config.spot_service_linked_role,
            depends_on=cluster.ready,
        ),
    )
    addons = Addons(
        "addons",
        AddonsArgs(
            cluster_name=name,
            region=config.region,
            vpc_id=network.vpc.id,
            oidc_provider_arn=cluster.oidc_provider_arn,
            oidc_provider_url=cluster.oidc_provider_url,
            provider=cluster.provider,
            depends_on=cluster.ready,
        ),
    )
    return network, cluster, addons


def _stores(
    config: InfraConfig, spec: StackSpec, network: Network
) -> tuple[ModelBucket, Images, Database, Cache]:
    """The model bucket, the image repositories, Aurora PostgreSQL and ElastiCache Redis."""
    artifacts = ArtifactsArgs(name=f"llmfleet-{config.deployment_name}", image_tag=config.image_tag)
    bucket = ModelBucket("models", artifacts)
    images = Images("images", artifacts)
    stores = DatastoreArgs(
        name=f"llmfleet-{config.deployment_name}",
        vpc_id=network.vpc.id,
        vpc_cidr=config.vpc_cidr,
        private_subnet_ids=network.private_subnet_ids,
        aurora_instance_class=config.aurora_instance_class,
        aurora_instances=config.aurora_instances,
        redis_node_type=config.redis_node_type,
        redis_replicas=config.redis_replicas,
    )
    database = Database("database", stores)
    cache = Cache("cache", stores)
    return bucket, images, database, cache


def _platform_apps(
    config: InfraConfig,
    spec: StackSpec,
    cluster: Cluster,
    addons: Addons,
    images: Images,
    database: Database,
    cache: Cache,
) -> None:
    """The gateway and the orchestrators, once the load balancer controller and the stores are up."""
    PlatformApps(
        "platform",
        PlatformArgs(
            target=PlatformTarget(
                gateway_image="",
                orchestrator_image="",
                stack=spec.name,
                api_host=config.api_host,
                nodes_host=config.nodes_host,
                certificate_arn=config.certificate_arn,
                gateway_min_replicas=config.gateway_min_replicas,
                gateway_max_replicas=config.gateway_max_replicas,
                orchestrator_replicas=config.orchestrator_replicas,
            ),
            gateway_image=images.refs["gateway"],
            orchestrator_image=images.refs["orchestrator"],
            database_url=database.url,
            redis_url=cache.url,
            provider=cluster.provider,
            depends_on=[
                addons.releases["aws-load-balancer-controller"],
                *addons.namespaces,
                *database.instances,
                cache.group,
            ],
        ),
    )


def config_from_pulumi() -> InfraConfig:
    cfg = pulumi.Config("llmfleet")
    keys = [
        "stack",
        "availabilityZones",
        "vpcCidr",
        "singleNatGateway",
        "apiHost",
        "nodesHost",
        "certificateArn",
        "amiAlias",
        "systemInstanceType",
        "systemNodesMin",
        "systemNodesDesired",
        "systemNodesMax",
        "auroraInstanceClass",
        "auroraInstances",
        "redisNodeType",
        "redisReplicas",
        "gatewayMinReplicas",
        "gatewayMaxReplicas",
        "orchestratorReplicas",
        "scaleModels",
        "spotServiceLinkedRole",
        "officeHoursTimezone",
        "officeHoursStart",
        "officeHoursEnd",
    ]
    values = {k: v for k in keys if (v := cfg.get(k)) is not None}
    region = pulumi.Config("aws").get("region")
    return InfraConfig.from_mapping(pulumi.get_stack(), values, region=region).check_deployable()
