"""The S3 model bucket (versioned, encrypted, no public access), the ECR repositories and the
container images built and pushed by `pulumi up` (pulumi-docker-build)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_aws as aws
import pulumi_docker_build as docker_build

REPO_ROOT = Path(__file__).resolve().parents[2]
# modelsync: the vLLM pods' init container (`llmfleet model-sync`), the only image with boto3.
IMAGES = ("gateway", "orchestrator", "agent", "modelsync")


# What the Dockerfiles COPY into the build: a change to any of these is a new image tag.
BUILD_INPUTS = ("pyproject.toml", "README.md", "apps", "stacks", "docker")


def content_tag(root: Path = REPO_ROOT) -> str:
    """`c-<12 hex>`: SHA-256 over the path and bytes of every build input (ECR repositories are
    IMMUTABLE, so a fixed tag fails the second push; this one changes exactly when the image does)."""
    digest = hashlib.sha256()
    for top in BUILD_INPUTS:
        base = root / top
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
        for path in files:
            if "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return "c-" + digest.hexdigest()[:12]


@dataclass(frozen=True)
class ArtifactsArgs:
    name: str
    image_tag: str


class ModelBucket(pulumi.ComponentResource):
    def __init__(self, name: str, args: ArtifactsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:infra:ModelBucket", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.bucket = aws.s3.Bucket(f"{name}", bucket_prefix=f"{args.name}-models-", opts=child)
        aws.s3.BucketVersioning(
            f"{name}-versioning",
            bucket=self.bucket.id,
            versioning_configuration={"status": "Enabled"},
            opts=child,
        )
        aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-encryption",
            bucket=self.bucket.id,
            rules=[
                {
                    "apply_server_side_encryption_by_default": {"sse_algorithm": "aws:kms"},
                    "bucket_key_enabled": True,
                }
            ],
            opts=child,
        )
        aws.s3.BucketPublicAccessBlock(
            f"{name}-no-public",
            bucket=self.bucket.id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=child,
        )
        self.register_outputs({"bucket": self.bucket.bucket})


class Images(pulumi.ComponentResource):
    def __init__(self, name: str, args: ArtifactsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("llmfleet:infra:Images", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.refs: dict[str, pulumi.Output[str]] = {}
        for app in IMAGES:
            repo = aws.ecr.Repository(
                f"{name}-{app}",
                name=f"{args.name}/{app}",
                image_tag_mutability="IMMUTABLE",
                image_scanning_configuration={"scan_on_push": True},
                encryption_configurations=[{"encryption_type": "KMS"}],
                opts=child,
            )
            auth = aws.ecr.get_authorization_token_output(
                registry_id=repo.registry_id, opts=pulumi.InvokeOutputOptions(parent=self)
            )
            image = docker_build.Image(
                f"{name}-{app}",
                context={"location": str(REPO_ROOT)},
                dockerfile={"location": str(REPO_ROOT / "docker" / f"{app}.Dockerfile")},
                platforms=[docker_build.Platform.LINUX_AMD64],
                push=True,
                tags=[pulumi.Output.concat(repo.repository_url, ":", args.image_tag)],
                registries=[
                    docker_build.RegistryArgs(
                        address=repo.repository_url, username=auth.user_name, password=auth.password
                    )
                ],
                opts=child,
            )
            self.refs[app] = image.ref
        self.register_outputs(dict(self.refs))
