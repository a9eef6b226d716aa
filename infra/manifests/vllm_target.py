"""What a vLLM pod is rendered from: the target (plan, images, bucket, revision), the capacity type
it runs on and its timing budget (stream budget, shutdown timeout, grace period, startup probe), all
derived from the planner's `ModelPlan`."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from apps.core.sizing.plan import ModelPlan


class Capacity(enum.Enum):
    ON_DEMAND = "on-demand"
    SPOT = "spot"  # prefers the spot pool, falls back to on-demand when spot is short


@dataclass(frozen=True)
class VllmTarget:
    """What the renderer needs besides the plan: images, bucket, revision and timing inputs."""

    plan: ModelPlan
    revision: str
    vllm_image: str
    agent_image: str
    model_bucket: str
    block_size: int = 16
    # The model's canary Deployment (`revision` is then the canary's; `vllm.deployment_name`).
    canary: bool = False


@dataclass(frozen=True)
class Timing:
    stream_budget_s: int  # the longest stream we promise to finish on shutdown
    shutdown_timeout_s: int
    grace_period_s: int
    startup_failure_threshold: int


def timing(plan: ModelPlan) -> Timing:
    # The longest stream vLLM can produce: a full --max-model-len answer at the planned per-stream rate
    # (an embedding model's: a --max-model-len input at the prompt rate each input gets at the target).
    # Idle pods do not wait for it (the preStop hooks end as soon as the agent has drained).
    stream = math.ceil(plan.max_model_len / plan.tokens_per_s_per_stream)
    shutdown = stream + 30
    # Agent drain (<= stream) then vLLM's own shutdown timeout, plus slack for SIGKILL.
    grace = stream + shutdown + 30
    # Weight loading from local NVMe plus CUDA graph capture; vLLM refuses connections meanwhile.
    startup_s = 300 + 10 * math.ceil(plan.weights_gib)
    return Timing(stream, shutdown, grace, math.ceil(startup_s / 10))
