"""Aurora PostgreSQL and ElastiCache Redis in the private subnets; their credentials live in
Secrets Manager and reach the apps as connection strings in a Kubernetes Secret."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
import pulumi_random as random


@dataclass(frozen=True)
class DatastoreArgs:
    name: str
    vpc_id: pulumi.Input[str]
    vpc_cidr: str
    private_subnet_ids: pulumi.Input[Sequence[pulumi.Input[str]]]
    aurora_instance_class: str
    aurora_instances: int
    redis_node_type: str
    redis_replicas: int


def _url_secret(name: str, secret_name: str, url: pulumi.Output[str], child: pulumi.ResourceOptions) -> None:
    """The store's URL as a Secrets Manager secret `secret_name-<suffix>` (`{"url": ...}`). A fixed
    name would block re-creating the stack: a deleted secret keeps its name for its recovery window."""
    secret = aws.secretsmanager.Secret(f"{name}-credentials", name_prefix=f"{secret_name}-", opts=child)
    aws.secretsmanager.SecretVersion(
        f"{name}-credentials",
        secret_id=secret.id,
        secret_string=url.apply(lambda u: json.dumps({"url": u})),
        opts=child,
    )


def _private_sg(name: str, args: DatastoreArgs, port: int, parent: pulumi.Resource) -> aws.ec2.SecurityGroup:
    # Reachable from inside the VPC only; never from the internet.
    return aws.ec2.SecurityGroup(
        name,
        vpc_id=args.vpc_id,
        description=f"{name}: port {port} from the VPC only",
        ingress=[{"protocol": "tcp", "from_port": port, "to_port": port, "cidr_blocks": [args.vpc_cidr]}],
        egress=[{"protocol": "-1", "from_port": 0, "to_port": 0, "cidr_blocks": [args.vpc_cidr]}],
        opts=pulumi.ResourceOptions(parent=parent),
    )


class Database(pulumi.ComponentResource):
    def __init__(self, name: str, args: DatastoreArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:infra:Database", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        password = random.RandomPassword(f"{name}-password", length=40, special=False, opts=child)
        subnets = aws.rds.SubnetGroup(f"{name}-subnets", subnet_ids=args.private_subnet_ids, opts=child)
        sg = _private_sg(f"{name}-sg", args, 5432, self)
        cluster = aws.rds.Cluster(
            f"{name}-aurora",
            engine="aurora-postgresql",
            engine_version="15.8",
            database_name="llmfleet",
            master_username="llmfleet",
            master_password=password.result,
            db_subnet_group_name=subnets.name,
            vpc_security_group_ids=[sg.id],
            storage_encrypted=True,
            backup_retention_period=7,
            deletion_protection=True,
            skip_final_snapshot=False,
            final_snapshot_identifier=f"{args.name}-final",
            opts=child,
        )
        # The migrate Job waits for these: a cluster without an instance accepts no connection.
        self.instances: list[pulumi.Resource] = []
        for i in range(args.aurora_instances):
            instance = aws.rds.ClusterInstance(
                f"{name}-aurora-{i}",
                cluster_identifier=cluster.id,
                instance_class=args.aurora_instance_class,
                engine=aws.rds.EngineType.AURORA_POSTGRESQL,
                publicly_accessible=False,
                db_subnet_group_name=subnets.name,
                opts=child,
            )
            self.instances.append(instance)
        self.url: pulumi.Output[str] = pulumi.Output.secret(
            pulumi.Output.concat(
                "postgresql://llmfleet:",
                password.result,
                "@",
                cluster.endpoint,
                ":5432/llmfleet?sslmode=require",
            )
        )
        _url_secret(name, f"{args.name}/database", self.url, child)
        self.register_outputs({"endpoint": cluster.endpoint})


class Cache(pulumi.ComponentResource):
    def __init__(self, name: str, args: DatastoreArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:infra:Cache", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        token = random.RandomPassword(f"{name}-auth-token", length=48, special=False, opts=child)
        subnets = aws.elasticache.SubnetGroup(
            f"{name}-subnets", subnet_ids=args.private_subnet_ids, opts=child
        )
        sg = _private_sg(f"{name}-sg", args, 6379, self)
        group = aws.elasticache.ReplicationGroup(
            f"{name}-redis",
            description="llmfleet quotas, streams and node heartbeats",
            engine="redis",
            engine_version="7.1",
            node_type=args.redis_node_type,
            num_cache_clusters=1 + args.redis_replicas,
            automatic_failover_enabled=args.redis_replicas > 0,
            multi_az_enabled=args.redis_replicas > 0,
            subnet_group_name=subnets.name,
            security_group_ids=[sg.id],
            at_rest_encryption_enabled=True,
            transit_encryption_enabled=True,
            auth_token=token.result,
            port=6379,
            opts=child,
        )
        self.group = group
        self.url: pulumi.Output[str] = pulumi.Output.secret(
            pulumi.Output.concat("rediss://:", token.result, "@", group.primary_endpoint_address, ":6379/0")
        )
        _url_secret(name, f"{args.name}/redis", self.url, child)
        self.register_outputs({"endpoint": group.primary_endpoint_address})
