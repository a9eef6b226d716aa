"""The EKS side of node pools: every vLLM pod's agent is a member `<pool>/$(POD_NAME)` of the pool
the migrate Job registers with the same Secret's token (else the orchestrator refuses every pod)."""

from __future__ import annotations

from typing import Any

from infra.manifests.node_agent import NODE_POOL, NODE_TOKEN_SECRET
from tests.infra.conftest import of_kind


def _arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def _token_ref(container: dict[str, Any]) -> dict[str, Any]:
    env = {e["name"]: e for e in container["env"]}
    ref: dict[str, Any] = env["LLMFLEET_NODE_TOKEN"]["valueFrom"]["secretKeyRef"]
    return ref


def _vllm_agents(kube: list[dict[str, Any]]) -> list[dict[str, Any]]:
    deployments = [d for d in of_kind(kube, "Deployment") if d["metadata"]["name"].startswith("vllm-")]
    assert deployments
    return [
        c for d in deployments for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == "agent"
    ]


def test_every_agent_sidecar_is_a_member_of_the_pool(kube: list[dict[str, Any]]) -> None:
    for agent in _vllm_agents(kube):
        assert _arg(agent["args"], "--node-id") == f"{NODE_POOL}/$(POD_NAME)"
        assert _token_ref(agent) == {"name": NODE_TOKEN_SECRET, "key": "token"}
        assert "LLMFLEET_NODE_TOKEN" not in " ".join(agent["args"])  # never on the command line


def test_the_migrate_job_migrates_then_registers_the_pool(kube: list[dict[str, Any]]) -> None:
    (job,) = [j for j in of_kind(kube, "Job") if j["metadata"]["name"] == "llmfleet-migrate"]
    pod = job["spec"]["template"]
    (migrate,) = pod["spec"]["initContainers"]
    assert migrate["args"] == ["admin", "migrate"]
    (register,) = pod["spec"]["containers"]
    args = register["args"]
    assert args[:2] == ["admin", "register-node-pool"]
    assert _arg(args, "--pool") == NODE_POOL
    assert _arg(args, "--location") == "cloud"
    assert register["image"] == migrate["image"]
    env = {e["name"] for e in register["env"]}
    assert {"LLMFLEET_DATABASE_URL", "LLMFLEET_REDIS_URL", "LLMFLEET_SECRET_KEY"} <= env
    # The very Secret the agents read, so the stored hash is the hash of their token.
    agents = _vllm_agents(kube)
    assert all(_token_ref(a) == _token_ref(register) for a in agents)
    # A rotated token changes the template, so Pulumi re-runs the Job and the new hash is stored.
    assert pod["metadata"]["annotations"]["llmfleet.io/node-token-sha256"]
