"""Run the program under Pulumi mocks and collect every resource with its inputs.

The offline stand-in for `pulumi preview`: `render(stack)` returns a sorted list of
`{type, name, inputs}` with secrets masked and numbers normalised, so the JSON is stable
and a golden snapshot diff shows exactly what a change does to the infrastructure.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import yaml
from pulumi.runtime.mocks import MockMonitor
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from apps.core.spec import load_spec
from infra.config import InfraConfig

SECRET_SIG = "4dabf18193072939515e22adb298388d"
MASK = "[secret]"
ACCOUNT = "123456789012"
RENDER_IMAGE_TAG = "c-render"
# Stand-in for the ACM certificate `pulumi up` requires (InfraConfig.check_deployable).
RENDER_CERTIFICATE_ARN = "arn:aws:acm:us-east-1:123456789012:certificate/00000000-0000-0000-0000-000000000000"
EKS_CLUSTER_SG = "sg-0eks0cluster0"  # the security group EKS creates with the cluster
PROJECT_DIR = Path(__file__).resolve().parents[1]


def _fake_id(typ: str, name: str) -> str:
    return hashlib.sha256(f"{typ}::{name}".encode()).hexdigest()[:12]


def _first_tag(tags: Any) -> str:
    if isinstance(tags, dict) and SECRET_SIG in tags:  # tags built from a secret-tainted output
        tags = tags.get("value")
    return str(tags[0]) if isinstance(tags, list) and tags else "image"


class Mocks(pulumi.runtime.Mocks):
    """Deterministic outputs for the few properties the program reads back."""

    def __init__(self) -> None:
        self.resources: list[dict[str, Any]] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict[Any, Any]]:
        self.resources.append({"type": args.typ, "name": args.name, "inputs": args.inputs})
        rid = f"{args.name}-{_fake_id(args.typ, args.name)}"
        state: dict[str, Any] = dict(args.inputs)
        state.setdefault("arn", f"arn:aws:mock:us-east-1:{ACCOUNT}:{args.name}")
        extra: dict[str, dict[str, Any]] = {
            "eks:index:Cluster": {
                "kubeconfigJson": "{}",
                "oidcProviderArn": f"arn:aws:iam::{ACCOUNT}:oidc-provider/oidc.eks.us-east-1.amazonaws.com/id/MOCK",
                "oidcProviderUrl": "https://oidc.eks.us-east-1.amazonaws.com/id/MOCK",
                "nodeSecurityGroupId": "sg-mock-nodes",
                "clusterSecurityGroupId": EKS_CLUSTER_SG,
            },
            "random:index/randomPassword:RandomPassword": {"result": "mock-" + _fake_id(args.typ, args.name)},
            "aws:ecr/repository:Repository": {
                "repositoryUrl": f"{ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com/{args.inputs.get('name')}",
                "registryId": ACCOUNT,
            },
            "docker-build:index:Image": {"ref": f"{_first_tag(args.inputs.get('tags'))}@sha256:mock"},
            "aws:s3/bucket:Bucket": {"bucket": f"{args.inputs.get('bucketPrefix', '')}mock"},
            "aws:rds/cluster:Cluster": {"endpoint": f"{args.name}.cluster-mock.us-east-1.rds.amazonaws.com"},
            "aws:elasticache/replicationGroup:ReplicationGroup": {
                "primaryEndpointAddress": f"{args.name}.mock.cache.amazonaws.com"
            },
            "aws:kms/key:Key": {"keyId": f"key-{_fake_id(args.typ, args.name)}"},
            "aws:sqs/queue:Queue": {
                "url": f"https://sqs.us-east-1.amazonaws.com/{ACCOUNT}/{args.inputs.get('name')}"
            },
        }
        state.update(extra.get(args.typ, {}))
        return rid, state

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[Any, Any], list[tuple[str, str]] | None]:
        # The mock monitor iterates the failures list, so it must be a list, not None.
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {"accountId": ACCOUNT, "arn": f"arn:aws:iam::{ACCOUNT}:user/mock", "userId": "mock"}, []
        if args.token == "aws:ecr/getAuthorizationToken:getAuthorizationToken":
            return {"userName": "AWS", "password": "mock-ecr-password", "proxyEndpoint": "https://mock"}, []
        return {}, []


# Values under these keys are credentials even when a provider does not mark them secret.
SECRET_KEYS = frozenset({"password", "masterPassword", "authToken", "secretString", "stringData"})


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        if value.get(SECRET_SIG) is not None:
            return MASK
        return {k: MASK if k in SECRET_KEYS else _clean(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.startswith(str(PROJECT_DIR)):
        # Absolute paths of this clone (Docker build context) would make snapshots machine-specific.
        return "." + value[len(str(PROJECT_DIR)) :]
    return value


def config_for(stack: str, project_dir: Path = PROJECT_DIR) -> InfraConfig:
    """The stack's `llmfleet:*` settings from `Pulumi.<stack>.yaml`, as `pulumi up` would see them."""
    path = project_dir / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        return InfraConfig(stack=stack, image_tag=RENDER_IMAGE_TAG, certificate_arn=RENDER_CERTIFICATE_ARN)
    raw = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("config", {})
    values = {k.split(":", 1)[1]: str(v) for k, v in raw.items() if k.startswith("llmfleet:")}
    config = InfraConfig.from_mapping(stack, values, region=raw.get("aws:region"))
    # A stable stand-in for the content digest, so the golden snapshot does not change with apps/.
    return dataclasses.replace(
        config, image_tag=RENDER_IMAGE_TAG, certificate_arn=config.certificate_arn or RENDER_CERTIFICATE_ARN
    )


def _urn_key(urn: str) -> str:
    """`urn:pulumi:stack::project::a$b::name` -> `b::name` (type token and name)."""
    parts = urn.split("::")
    return f"{parts[2].split('$')[-1]}::{parts[3]}"


class _ParentRecordingMonitor(MockMonitor):
    """Records each resource's parent type and its dependencies (explicit `depends_on` and the
    resources whose outputs it takes), so the render and its golden diff show ordering."""

    def __init__(self, mocks: Mocks) -> None:
        super().__init__(mocks)
        self.parents: dict[tuple[str, str], str] = {}
        self.dependencies: dict[tuple[str, str], list[str]] = {}

    def RegisterResource(self, request: Any) -> Any:
        key = (str(request.type), str(request.name))
        self.parents[key] = str(request.parent).split("::")[2].split("$")[-1] if request.parent else ""
        deps = {_urn_key(str(u)) for u in request.dependencies}
        for prop in request.propertyDependencies.values():
            deps.update(_urn_key(str(u)) for u in prop.urns)
        self.dependencies[key] = sorted(deps)
        return super().RegisterResource(request)  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class RenderResult:
    rows: list[dict[str, Any]]
    parents: dict[tuple[str, str], str]  # (type, name) -> type of the parent resource


def render(stack: str, config: InfraConfig | None = None) -> list[dict[str, Any]]:
    """Every resource the program would create for `stack`, sorted by (type, name)."""
    return render_program(stack, config).rows


def render_program(stack: str, config: InfraConfig | None = None) -> RenderResult:
    """`render` plus the parent of every resource."""
    # Pulumi's runtime looks up "the current event loop" (set_mocks creates futures on it). After
    # other asyncio code in the same process (pytest-asyncio unsets its loops) there is none: give
    # it one, as Pulumi's own `_ensure_event_loop` would, and leave it current for later renders.
    try:
        asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:
        asyncio.set_event_loop(asyncio.new_event_loop())
    return _render_on_current_loop(stack, config)


def _render_on_current_loop(stack: str, config: InfraConfig | None) -> RenderResult:
    config = config or config_for(stack)
    spec = load_spec(config.stack)
    mocks = Mocks()
    monitor = _ParentRecordingMonitor(mocks)
    pulumi.runtime.set_mocks(mocks, project="llmfleet", stack=spec.name, preview=False, monitor=monitor)
    with warnings.catch_warnings():
        # The generated SDKs warn at import about deprecated classes we do not use (pulumi-eks'
        # legacy NodeGroup, pulumi-aws' renamed resources); pytest turns warnings into errors.
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"pulumi_(aws|eks)(\.|$)")
        from infra.program import define  # imported late: the mocks must be set first

        _sync_await(run_pulumi_func(lambda: define(config, spec)))
    rows = [
        {
            "type": r["type"],
            "name": r["name"],
            "inputs": _clean(r["inputs"]),
            "parent": monitor.parents.get((r["type"], r["name"]), ""),
            "dependsOn": monitor.dependencies.get((r["type"], r["name"]), []),
        }
        for r in mocks.resources
    ]
    return RenderResult(sorted(rows, key=lambda r: (r["type"], r["name"])), dict(monitor.parents))
