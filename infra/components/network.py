"""Network: VPC, private subnets for the serving plane, public subnets for the ALB and NAT,
an S3 gateway endpoint and interface endpoints for ECR, STS and CloudWatch Logs."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws


@dataclass(frozen=True)
class NetworkArgs:
    cluster_name: str
    cidr: str
    availability_zones: tuple[str, ...]
    region: str
    single_nat_gateway: bool


class Network(pulumi.ComponentResource):
    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:infra:Network", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        net = ipaddress.ip_network(args.cidr)
        blocks = list(net.subnets(new_prefix=20))
        cluster_tag = {f"kubernetes.io/cluster/{args.cluster_name}": "shared"}
        self.vpc = aws.ec2.Vpc(
            f"{name}-vpc",
            cidr_block=args.cidr,
            enable_dns_hostnames=True,
            enable_dns_support=True,
            tags={"Name": f"{args.cluster_name}-vpc"},
            opts=child,
        )
        igw = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=self.vpc.id, opts=child)
        public_rt = aws.ec2.RouteTable(
            f"{name}-public",
            vpc_id=self.vpc.id,
            routes=[{"cidr_block": "0.0.0.0/0", "gateway_id": igw.id}],
            opts=child,
        )
        self.public_subnets: list[aws.ec2.Subnet] = []
        self.private_subnets: list[aws.ec2.Subnet] = []
        private_rts: list[aws.ec2.RouteTable] = []
        nat: aws.ec2.NatGateway | None = None
        for i, az in enumerate(args.availability_zones):
            public = aws.ec2.Subnet(
                f"{name}-public-{az}",
                vpc_id=self.vpc.id,
                cidr_block=str(blocks[i]),
                availability_zone=az,
                map_public_ip_on_launch=False,
                tags={
                    **cluster_tag,
                    "kubernetes.io/role/elb": "1",
                    "Name": f"{args.cluster_name}-public-{az}",
                },
                opts=child,
            )
            aws.ec2.RouteTableAssociation(
                f"{name}-public-{az}", subnet_id=public.id, route_table_id=public_rt.id, opts=child
            )
            self.public_subnets.append(public)
            if nat is None or not args.single_nat_gateway:
                eip = aws.ec2.Eip(f"{name}-nat-{az}", domain="vpc", opts=child)
                nat = aws.ec2.NatGateway(
                    f"{name}-nat-{az}", subnet_id=public.id, allocation_id=eip.id, opts=child
                )
            private = aws.ec2.Subnet(
                f"{name}-private-{az}",
                vpc_id=self.vpc.id,
                cidr_block=str(blocks[8 + i]),
                availability_zone=az,
                tags={
                    **cluster_tag,
                    "kubernetes.io/role/internal-elb": "1",
                    "karpenter.sh/discovery": args.cluster_name,
                    "Name": f"{args.cluster_name}-private-{az}",
                },
                opts=child,
            )
            rt = aws.ec2.RouteTable(
                f"{name}-private-{az}",
                vpc_id=self.vpc.id,
                routes=[{"cidr_block": "0.0.0.0/0", "nat_gateway_id": nat.id}],
                opts=child,
            )
            aws.ec2.RouteTableAssociation(
                f"{name}-private-{az}", subnet_id=private.id, route_table_id=rt.id, opts=child
            )
            self.private_subnets.append(private)
            private_rts.append(rt)
        # Endpoints keep image pulls, STS and logs off the NAT and inside the VPC.
        endpoint_sg = aws.ec2.SecurityGroup(
            f"{name}-endpoints",
            vpc_id=self.vpc.id,
            description="VPC interface endpoints: HTTPS from inside the VPC only",
            ingress=[{"protocol": "tcp", "from_port": 443, "to_port": 443, "cidr_blocks": [args.cidr]}],
            egress=[{"protocol": "-1", "from_port": 0, "to_port": 0, "cidr_blocks": [args.cidr]}],
            opts=child,
        )
        aws.ec2.VpcEndpoint(
            f"{name}-s3",
            vpc_id=self.vpc.id,
            service_name=f"com.amazonaws.{args.region}.s3",
            vpc_endpoint_type="Gateway",
            route_table_ids=[rt.id for rt in private_rts],
            opts=child,
        )
        for service in ("ecr.api", "ecr.dkr", "sts", "logs"):
            aws.ec2.VpcEndpoint(
                f"{name}-{service.replace('.', '-')}",
                vpc_id=self.vpc.id,
                service_name=f"com.amazonaws.{args.region}.{service}",
                vpc_endpoint_type="Interface",
                private_dns_enabled=True,
                subnet_ids=[s.id for s in self.private_subnets],
                security_group_ids=[endpoint_sg.id],
                opts=child,
            )
        self.private_subnet_ids = pulumi.Output.all(*[s.id for s in self.private_subnets])
        self.public_subnet_ids = pulumi.Output.all(*[s.id for s in self.public_subnets])
        self.register_outputs({"vpc_id": self.vpc.id, "private_subnet_ids": self.private_subnet_ids})
