"""The S3 model bucket (versioned, encrypted, no public access), the ECR repositories and the
container images built and pushed by `pulumi up` (pulumi-docker-build)."""

from __future__ import annotations

import fnmatch
import hashlib
import re
import shlex
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_aws as aws
import pulumi_docker_build as docker_build

from apps.core.errors import LlmfleetError

REPO_ROOT = Path(__file__).resolve().parents[2]
# modelsync: the vLLM pods' init container (`llmfleet model-sync`), the only image with boto3.
# vllm: upstream's vLLM image mirrored into ECR (docker/vllm.Dockerfile is one FROM line), so a
# GPU scale-up pulls from ECR through the VPC endpoint, not anonymously from Docker Hub.
IMAGES = ("gateway", "orchestrator", "agent", "modelsync", "vllm")

# The Docker build context: exactly these paths. `.dockerignore` admits them and nothing else
# (`dockerignore_text()`, checked by tests/infra/test_image_inputs.py), and each image's tag is
# the digest of the ones its Dockerfile COPYs plus the Dockerfile: a change outside this list
# (a commit, `Pulumi.<stack>.yaml`, docs) neither rebuilds nor retags; one inside retags.
# pulumi-docker-build (v0.0.22, the pinned SDK's provider) rebuilds when its context hash changes;
# it hashes the context through `.dockerignore` (a `<Dockerfile>.dockerignore` would take
# precedence: there is none) plus the Dockerfile, and its diff ignores the ECR password, which
# changes every run (provider/internal/context.go getIgnorePatterns, image.go Diff, at eb787fad).
BUILD_CONTEXT = ("pyproject.toml", "README.md", "constraints.txt", "apps", "stacks")
CONTEXT_EXCLUDED = ("__pycache__", "*.pyc")
_COPY = re.compile(r"^COPY\s+(?!--from)(.+)$", re.M)


class BuildInputError(LlmfleetError):
    code = "build_input_outside_context"


def dockerfile(app: str, root: Path = REPO_ROOT) -> Path:
    return root / "docker" / f"{app}.Dockerfile"


def image_inputs(app: str, root: Path = REPO_ROOT) -> list[str]:
    """The context paths `docker/<app>.Dockerfile` COPYs (each must be in BUILD_CONTEXT)."""
    text = re.sub(r"\\\n", " ", dockerfile(app, root).read_text(encoding="utf-8"))
    sources: list[str] = []
    for match in _COPY.finditer(text):
        *srcs, _dest = shlex.split(match.group(1))
        sources.extend(s.rstrip("/") for s in srcs)
    outside = sorted(set(sources) - set(BUILD_CONTEXT))
    if outside:
        raise BuildInputError(
            f"docker/{app}.Dockerfile copies {', '.join(outside)}: not in BUILD_CONTEXT "
            "(infra/components/artifacts.py), so the build context and the image tag would miss it"
        )
    return sorted(set(sources))


def context_files(paths: Sequence[str], root: Path = REPO_ROOT) -> list[Path]:
    """The files under `paths` the build context holds (caches excluded, as in `.dockerignore`)."""
    out: list[Path] = []
    for top in paths:
        base = root / top
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
        for path in files:
            rel = path.relative_to(root)
            if any(fnmatch.fnmatch(part, pattern) for part in rel.parts for pattern in CONTEXT_EXCLUDED):
                continue
            out.append(path)
    return out


def content_tag(app: str, root: Path = REPO_ROOT) -> str:
    """`c-<12 hex>`: SHA-256 over the Dockerfile and the path, mode and bytes of every file the
    image's build COPYs (what pulumi-docker-build's context hash covers, and what COPY keeps).
    ECR repositories are IMMUTABLE: a tag that changed without its content (or the reverse)
    fails the push; this one changes exactly when the image does."""
    digest = hashlib.sha256(dockerfile(app, root).read_bytes())
    for path in context_files(image_inputs(app, root), root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(stat.filemode(path.lstat().st_mode).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return "c-" + digest.hexdigest()[:12]


def dockerignore_text() -> str:
    """`.dockerignore` for BUILD_CONTEXT: everything out, the listed paths back in, caches out."""
    lines = ["# Generated from BUILD_CONTEXT in infra/components/artifacts.py: edit that list.", "*"]
    lines += [f"!{path}" for path in BUILD_CONTEXT]
    lines += [f"**/{pattern}" for pattern in CONTEXT_EXCLUDED]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ArtifactsArgs:
    name: str
    image_tag: str | None = None  # None: each image's content_tag (the render uses a fixed stand-in)


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
        # Signs each revision's manifest (`llmfleet model publish`); the vLLM pods' model-sync role
        # may only verify with it (infra/manifests/iam.py `model_sync_read`). Asymmetric: the
        # public half cannot sign, and KMS never lets the private half out.
        self.signing_key = aws.kms.Key(
            f"{name}-signing",
            description=f"{args.name}: signs model revision manifests (llmfleet model publish)",
            key_usage="SIGN_VERIFY",
            customer_master_key_spec="ECC_NIST_P256",
            deletion_window_in_days=30,
            opts=child,
        )
        self.signing_alias = aws.kms.Alias(
            f"{name}-signing",
            name=f"alias/{args.name}-model-signing",
            target_key_id=self.signing_key.key_id,
            opts=child,
        )
        self.register_outputs({"bucket": self.bucket.bucket, "signing_key": self.signing_key.arn})


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
                tags=[pulumi.Output.concat(repo.repository_url, ":", args.image_tag or content_tag(app))],
                registries=[
                    docker_build.RegistryArgs(
                        address=repo.repository_url, username=auth.user_name, password=auth.password
                    )
                ],
                opts=child,
            )
            self.refs[app] = image.ref
        self.register_outputs(dict(self.refs))
