"""The llmfleet agent sidecar of a vLLM pod: its container, its node id in the cloud node pool (the
Secret's pool token admits every `<pool>/<pod name>`) and its drain bound (the stream budget, within
what is left of a Spot reclaim notice on the spot pool)."""

from __future__ import annotations

from infra.manifests.appenv import AgentSettings, from_secret
from infra.manifests.common import (
    AGENT_HEALTH_PORT,
    KV_EVENTS_ENDPOINT,
    KV_REPLAY_ENDPOINT,
    NAMESPACE,
    NODE_PORT,
    VLLM_PORT,
    Manifest,
)
from infra.manifests.vllm_target import Capacity, Timing, VllmTarget

NODE_TOKEN_SECRET = "llmfleet-cloud-node-token"
# Every vLLM pod's agent shares the Secret's token as members of this node pool: pod names are
# not known in advance, so the migrate Job registers the pool and the agent's node id is
# `<pool>/<pod name>` (apps.core.nodes.ids).
NODE_POOL = "eks"


def agent_node_id(pool: str = NODE_POOL) -> str:
    """The sidecar's node id: a member of the pool the migrate Job registers."""
    return f"{pool}/$(POD_NAME)"


# EC2 announces a Spot reclaim two minutes ahead; Karpenter (its interruption queue) drains the node
# at once. A spot pod's agent drains within what is left of the notice minus the time another node
# needs to take over the streams handed off at the deadline (resumed there: docs/control-plane.md).
SPOT_NOTICE_S = 120
SPOT_HANDOFF_S = 20


def agent_drain_s(tm: Timing, capacity: Capacity) -> int:
    """The agent's drain bound: the stream budget, within the Spot notice on the spot pool."""
    if capacity is Capacity.ON_DEMAND:
        return tm.stream_budget_s
    return min(tm.stream_budget_s, SPOT_NOTICE_S - SPOT_HANDOFF_S)


def _agent_args(t: VllmTarget, tm: Timing, capacity: Capacity) -> list[str]:
    p = t.plan
    args = [
        "agent",
        "--orchestrator-url",
        f"ws://orchestrator.{NAMESPACE}.svc:{NODE_PORT}/v1/nodes/connect",
        "--node-id",
        agent_node_id(),
        "--engine-url",
        f"http://127.0.0.1:{VLLM_PORT}",
        "--model",
        p.name,
        "--model-revision",
        t.revision,
        "--max-num-seqs",
        str(p.max_num_seqs),
        "--max-model-len",
        str(p.max_model_len),
        "--gpus",
        str(p.gpus_per_replica),
        "--location",
        "cloud",
        "--drain-timeout",
        str(agent_drain_s(tm, capacity)),
        "--journal",
        "/var/lib/llmfleet/journal",
        "--health-host",
        "0.0.0.0",  # the kubelet probes the pod IP
        "--health-port",
        str(AGENT_HEALTH_PORT),
    ]
    if p.task == "embed":
        return args  # an embedding engine keeps no KV cache: it publishes no KV events to forward
    return [
        *args,
        "--kv-events-endpoint",
        KV_EVENTS_ENDPOINT,
        "--kv-events-replay-endpoint",
        KV_REPLAY_ENDPOINT,
    ]


def agent_container(t: VllmTarget, tm: Timing, capacity: Capacity) -> Manifest:
    """The llmfleet agent sidecar: registers with the orchestrator as a pool member, relays to vLLM."""
    return {
        "name": "agent",
        "image": t.agent_image,
        "args": _agent_args(t, tm, capacity),
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            from_secret(AgentSettings, "node_token", NODE_TOKEN_SECRET, "token"),
        ],
        "ports": [{"name": "agent", "containerPort": AGENT_HEALTH_PORT}],
        # /readyz follows registration and drain state; /livez stays 200 while draining.
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "agent"}, "periodSeconds": 5},
        "livenessProbe": {
            "httpGet": {"path": "/livez", "port": "agent"},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
        # The agent drains on SIGTERM (no new assignments, in-flight streams finish); the hook
        # blocks until it has, so vLLM is not stopped under running streams.
        "lifecycle": {
            "preStop": {
                "exec": {
                    "command": [
                        "/bin/sh",
                        "-c",
                        "kill -TERM 1; while kill -0 1 2>/dev/null; do sleep 1; done",
                    ]
                }
            }
        },
        "volumeMounts": [{"name": "journal", "mountPath": "/var/lib/llmfleet"}],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
        },
    }
