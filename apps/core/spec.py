"""The per-stack platform spec (`stacks/<stack>.yaml`): one source for the planner,
the infrastructure, the gateway's prices and the load generator.

Loading fails with the file, the field path and the reason (`SpecError`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from apps.core.errors import SpecError
from apps.core.sizing.kv import DTYPE_BYTES

PositiveInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]


def _stacks_dir() -> Path:
    """`stacks/` of the checkout, else the copy the wheel installs (pyproject `data-files`)."""
    checkout = Path(__file__).resolve().parents[2] / "stacks"
    installed = Path(sys.prefix) / "share" / "llmfleet" / "stacks"
    return checkout if checkout.is_dir() or not installed.is_dir() else installed


STACKS_DIR = _stacks_dir()


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuType(_Strict):
    memory_gib: PositiveFloat
    price_per_gpu_hour_usd: NonNegFloat
    instance_family: str
    gpus_per_instance: tuple[PositiveInt, ...] = (1,)


# Prompt tokens the engine found in its prefix cache cost this share of the prompt price unless the
# stack names a cached price (their prefill is not computed again: the GPU time is mostly saved).
CACHED_INPUT_FRACTION = 0.25


class Prices(_Strict):
    """Credits are integer microcredits; 1 credit = 1,000,000 microcredits."""

    prompt_per_million_microcredits: NonNegInt
    completion_per_million_microcredits: NonNegInt
    cached_prompt_per_million_microcredits: NonNegInt | None = None  # None: CACHED_INPUT_FRACTION of prompt
    # A response cache hit's tokens, prompt and completion (None: the cached prompt price; docs/response-cache.md)
    cache_hit_per_million_microcredits: NonNegInt | None = None

    @model_validator(mode="after")
    def _cached_not_dearer(self) -> Prices:
        cached = self.cached_prompt_per_million_microcredits
        if cached is not None and cached > self.prompt_per_million_microcredits:
            raise ValueError("cached_prompt_per_million_microcredits must not exceed the prompt price")
        return self

    @property
    def cached_prompt(self) -> int:
        """The price per million cached prompt tokens."""
        if self.cached_prompt_per_million_microcredits is not None:
            return self.cached_prompt_per_million_microcredits
        return int(self.prompt_per_million_microcredits * CACHED_INPUT_FRACTION)

    @property
    def cache_hit(self) -> int:
        """The price per million tokens (prompt and completion) of an answer from the response cache."""
        if self.cache_hit_per_million_microcredits is not None:
            return self.cache_hit_per_million_microcredits
        return self.cached_prompt


class ReplicaBounds(_Strict):
    min: NonNegInt
    max: PositiveInt

    @model_validator(mode="after")
    def _ordered(self) -> ReplicaBounds:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
        return self


class Serving(_Strict):
    """How a model is served and planned. For `task: embed` a stream is one input being embedded and
    `planning_context_tokens` the mean tokens of one input (docs/planner.md, "Embedding models")."""

    gpu_type: str
    # What the model's engine runs (vLLM's `--runner`): `generate` answers `/v1/chat/completions` and
    # `/v1/completions`; `embed` answers `/v1/embeddings` only (vLLM's pooling runner, issue 31).
    task: Literal["generate", "embed"] = "generate"
    max_model_len: PositiveInt
    planning_context_tokens: PositiveInt = 2048
    # Streams per replica the plan schedules: required for `generate`; for `embed`, inputs in flight,
    # derived from the prompt-token rate unless set (apps.core.sizing.plan).
    streams_per_replica: PositiveInt | None = None
    headroom: NonNegFloat = 0.0
    tensor_parallel_size: PositiveInt | None = None
    max_num_seqs: PositiveInt | None = None
    replicas: ReplicaBounds
    # Decode rate of one replica at `streams_per_replica` streams: `generate` only (and required).
    output_tokens_per_s_per_replica: PositiveFloat | None = None
    # Prompt tokens one replica embeds per second at full load (measured): `embed` only (and required);
    # the plan sizes an embed model's replicas by it.
    prompt_tokens_per_s_per_replica: PositiveFloat | None = None
    mean_answer_tokens: PositiveInt = 400
    default_max_tokens: PositiveInt = 1024
    spot: bool = False
    # A stream whose node is lost after output started continues on another node of the model
    # (apps/orchestrator/resume.py); off: the client gets the error event and the partial settle.
    resume_streams: bool = True
    # Prefix-aware picks (apps/core/scheduling/prefix.py): the load a node's whole-prefix match may
    # outweigh (0: off), and how far ahead of the least-loaded node of its tier it may run and keep it.
    prefix_weight: NonNegFloat = 0.5
    prefix_hot_margin: PositiveFloat = 0.5
    # The share of prompt tokens the engines find in their prefix cache (measured: the dashboards'
    # prefix-cache hit rate): the plan prices prompts at it, `llmfleet simulate` skips its prefill.
    prefix_hit_rate: Fraction = 0.0
    on_demand_min_replicas: NonNegInt = 0
    office_hours_warm_replicas: NonNegInt = 0

    @model_validator(mode="before")
    @classmethod
    def _embed_resumes_nothing(cls, data: object) -> object:
        """An embed model answers in one piece: `resume_streams` is off unless the file says so."""
        if isinstance(data, dict) and data.get("task") == "embed" and "resume_streams" not in data:
            return {**data, "resume_streams": False}
        return data

    @model_validator(mode="after")
    def _task_fields(self) -> Serving:
        """Each task's fields are required for it and refused for the other."""
        if self.task == "embed":
            if self.prompt_tokens_per_s_per_replica is None:
                raise ValueError("prompt_tokens_per_s_per_replica is required for task: embed")
            if self.output_tokens_per_s_per_replica is not None:
                raise ValueError("output_tokens_per_s_per_replica: an embed model decodes nothing")
            if self.resume_streams:
                raise ValueError("resume_streams: an embed model answers in one piece, nothing streams")
            if self.prefix_hit_rate:
                raise ValueError("prefix_hit_rate: an embed model keeps no prefix cache (leave it 0)")
        else:
            if self.streams_per_replica is None:
                raise ValueError("streams_per_replica is required for task: generate")
            if self.output_tokens_per_s_per_replica is None:
                raise ValueError("output_tokens_per_s_per_replica is required for task: generate")
            if self.prompt_tokens_per_s_per_replica is not None:
                raise ValueError("prompt_tokens_per_s_per_replica applies to task: embed only")
        return self


def revision_problem(revision: str) -> str | None:
    """Why `revision` cannot name a model revision, or None. It is one path component of the registry
    (`s3://<bucket>/<model>/<revision>/`) and of the node cache, and the node protocol carries at most
    128 characters of it."""
    if not revision.strip():
        return "must not be empty"
    if revision != revision.strip() or any(not c.isprintable() for c in revision):
        return f"{revision!r} has surrounding spaces or unprintable characters"
    if revision in (".", "..") or "/" in revision or revision.startswith("."):
        return f"{revision!r} is not one path component (no '/', no leading '.')"
    if len(revision) > 128:
        return f"{len(revision)} characters, at most 128"
    return None


class Canary(_Strict):
    """A model's second live revision, rolled out next to the stable `revision`: its own Deployment and
    ScaledObject (infra/components/serving.py). It holds at least one replica while it is set (its own
    load is its scaling signal, and a canary without a replica serves nothing). Remove it after a
    promotion (the model's `revision` then names it) or a rollback."""

    revision: str
    min_replicas: int = 1
    max_replicas: PositiveInt = 2

    @field_validator("revision")
    @classmethod
    def _one_path_component(cls, revision: str) -> str:
        problem = revision_problem(revision)
        if problem is not None:
            raise ValueError(problem)
        return revision

    @field_validator("min_replicas")
    @classmethod
    def _live(cls, value: int) -> int:
        if value < 1:
            raise ValueError(
                f"{value}: a canary keeps at least 1 replica (its own load is what scales it; "
                "to stop it, remove canary)"
            )
        return value

    @model_validator(mode="after")
    def _ordered(self) -> Canary:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) must not exceed max_replicas ({self.max_replicas})"
            )
        return self


class ModelSpec(_Strict):
    parameters_b: PositiveFloat
    layers: PositiveInt
    kv_heads: PositiveInt
    head_dim: PositiveInt
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    max_context: PositiveInt
    revision: str = "main"
    # The revision rolled out next to `revision` (both live: the orchestrator splits the traffic).
    canary: Canary | None = None
    prices: Prices
    serving: Serving
    # The length of the vectors an embedding model returns (`serving.task: embed`; unset otherwise).
    embedding_dimensions: PositiveInt | None = None

    @model_validator(mode="after")
    def _dtypes_and_context(self) -> ModelSpec:
        embeds = self.serving.task == "embed"
        if embeds != (self.embedding_dimensions is not None):
            raise ValueError(
                "embedding_dimensions is required for a model with serving.task: embed, and only for one"
            )
        if embeds and self.prices.completion_per_million_microcredits != 0:
            raise ValueError(
                "prices.completion_per_million_microcredits: an embed model produces no completion tokens "
                "(set it to 0)"
            )
        for name in ("weight_dtype", "kv_dtype"):
            value = getattr(self, name)
            if value.lower() not in DTYPE_BYTES:
                raise ValueError(f"{name}: unknown dtype {value!r} (known: {', '.join(sorted(DTYPE_BYTES))})")
        if self.serving.max_model_len > self.max_context:
            raise ValueError(
                f"serving.max_model_len {self.serving.max_model_len} is longer than the model allows "
                f"({self.max_context})"
            )
        if self.serving.planning_context_tokens > self.serving.max_model_len:
            raise ValueError("serving.planning_context_tokens must not exceed serving.max_model_len")
        if self.canary is not None and self.canary.revision == self.revision:
            raise ValueError(
                f"canary.revision {self.revision!r} is the model's revision: a canary names another one "
                "(after a promotion, remove canary)"
            )
        return self


class OnPremServer(_Strict):
    name: str
    gpu_type: str
    gpus: PositiveInt


class SizingDefaults(_Strict):
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.9
    activation_reserve_gib_per_gpu: NonNegFloat = 2.0
    block_size: PositiveInt = 16
    # Cold start (scale from zero): weights read from the node's model cache (local NVMe) at this
    # rate, then the engine's own start-up (CUDA graphs, warm-up). `sizing.coldstart` turns them into
    # a model's expected load time, the `Retry-After` of a request that meets a loading model.
    cache_gib_per_s: PositiveFloat = 2.0
    engine_start_s: NonNegFloat = 60.0


class CostInputs(_Strict):
    average_cloud_gpus: NonNegFloat
    hours_per_month: PositiveFloat = 730


class Slo(_Strict):
    ttft_p50_s: PositiveFloat = 1.0
    ttft_p95_s: PositiveFloat = 3.0
    tokens_per_s_per_stream: PositiveFloat = 20
    queue_wait_p95_s: PositiveFloat = 5.0
    queue_limit_s: PositiveFloat = 30.0


class RequestLimits(_Strict):
    """Bounds on one chat request, enforced by the gateway before any money is reserved."""

    max_n: Annotated[int, Field(ge=1, le=128)] = 8  # choices per request (`n`); above it: 400


class Sharing(_Strict):
    """Defaults of the sharing model (`apps.core.sharing`): the weight of a team created without
    one. A team's own weight and limits are set through the admin API (`/admin/teams/sharing`)."""

    default_weight: Annotated[float, Field(gt=0, le=1000)] = 1.0


class Alerting(_Strict):
    """Alert thresholds (the brief's values as defaults); rendered into the PrometheusRule."""

    kv_cache_usage_max: Annotated[float, Field(gt=0, le=1)] = 0.9
    kv_cache_for: str = "5m"
    preemptions_per_s_max: NonNegFloat = 1.0
    error_ratio_max: Annotated[float, Field(gt=0, le=1)] = 0.05  # 503s (and 429s) per request
    ledger_drift_max: Annotated[float, Field(gt=0, lt=1)] = 0.001
    scale_to_zero_idle_for: str = "2h"
    gpu_engine_active_min: Annotated[float, Field(gt=0, le=1)] = 0.2
    gpu_idle_for: str = "1h"
    nodepool_gpu_limit_ratio: Annotated[float, Field(gt=0, le=1)] = 0.9
    monthly_gpu_budget_usd: NonNegFloat = 20_000
    slo_attainment_min: Annotated[float, Field(gt=0, le=1)] = 0.95
    task_growth_min: PositiveInt = 200  # tasks above the pod's own minimum of the last 3 h
    task_growth_for: str = "2h"


class StackSpec(_Strict):
    name: str
    region: str = "us-east-1"
    cluster_name: str = "inference"
    kubernetes_version: str = "1.35"
    gpu_types: dict[str, GpuType]
    sizing: SizingDefaults = SizingDefaults()
    models: dict[str, ModelSpec]
    # Peak concurrent streams per model; for an embed model, its peak inputs in flight (the sequences
    # its engines hold at once: what KEDA's demand trigger counts).
    peak_streams: dict[str, NonNegInt]
    onprem: tuple[OnPremServer, ...] = ()
    cost: CostInputs
    slo: Slo = Slo()
    request_limits: RequestLimits = RequestLimits()
    sharing: Sharing = Sharing()
    alerting: Alerting = Alerting()
    # Optional ceiling per GPU NodePool (e.g. `gpu-l40s: 32`); `llmfleet plan` fails when the
    # replica maxima need more (apps.core.sizing.pools).
    gpu_pool_caps: dict[str, PositiveInt] = {}

    @model_validator(mode="after")
    def _references(self) -> StackSpec:
        for name, model in self.models.items():
            if model.serving.gpu_type not in self.gpu_types:
                raise ValueError(
                    f"models.{name}.serving.gpu_type: unknown GPU type {model.serving.gpu_type!r}"
                )
        for name in self.peak_streams:
            if name not in self.models:
                raise ValueError(f"peak_streams.{name}: not a model of this stack")
        for server in self.onprem:
            if server.gpu_type not in self.gpu_types:
                raise ValueError(f"onprem.{server.name}.gpu_type: unknown GPU type {server.gpu_type!r}")
        return self

    @property
    def onprem_gpus(self) -> int:
        return sum(s.gpus for s in self.onprem)


def _field_path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "<root>"


def parse_spec(data: object, source: str = "<spec>") -> StackSpec:
    """Validate a decoded spec; errors name the source, the field path and the reason."""
    try:
        return StackSpec.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        path = _field_path(tuple(first["loc"]))
        reason = first["msg"].removeprefix("Value error, ")
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise SpecError(f"{source}: {path}: {reason}{more}", param=path) from None


def resolve_stack_path(stack: str) -> Path:
    """`prod` -> `stacks/prod.yaml`; anything with a slash or a .yaml suffix is a path."""
    if "/" in stack or stack.endswith((".yaml", ".yml")):
        return Path(stack)
    return STACKS_DIR / f"{stack}.yaml"


def load_spec(stack: str | Path) -> StackSpec:
    path = resolve_stack_path(str(stack))
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"{path}: cannot read stack spec: {exc.strerror}", param="stack") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}", param="stack") from None
    return parse_spec(data, str(path))


ModelName = str
CapacityType = Literal["on-demand", "spot"]
