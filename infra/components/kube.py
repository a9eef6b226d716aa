"""`KubeObject`: a Kubernetes object registered with the inputs a pure renderer returned.

The rendered dict is the resource's input as-is (type token `kubernetes:<group>/<version>:<kind>`,
the same token the typed pulumi_kubernetes classes use), so the object the tests validate is
exactly the object `pulumi up` sends.
"""

from __future__ import annotations

from typing import Any

import pulumi
from pulumi_kubernetes import _utilities as k8s_utilities


def type_token(api_version: str, kind: str) -> str:
    group_version = api_version if "/" in api_version else f"core/{api_version}"
    return f"kubernetes:{group_version}:{kind}"


def resource_name(obj: dict[str, Any]) -> str:
    metadata = obj["metadata"]
    namespace = metadata.get("namespace")
    kind = str(obj["kind"]).lower()
    return f"{kind}-{namespace}-{metadata['name']}" if namespace else f"{kind}-{metadata['name']}"


class KubeObject(pulumi.CustomResource):
    def __init__(self, obj: dict[str, Any], opts: pulumi.ResourceOptions) -> None:
        version: str = k8s_utilities.get_version()  # type: ignore[no-untyped-call]
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(version=version))
        super().__init__(type_token(obj["apiVersion"], obj["kind"]), resource_name(obj), dict(obj), opts)
