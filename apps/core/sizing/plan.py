"""The capacity plan of a stack: spec in, per-model and fleet numbers out.

The planner CLI prints this; the Pulumi program renders vLLM flags, replica bounds and
KEDA thresholds from it (docs/architecture.md D8), so both always agree.

A generate model is sized by its KV cache and decode rate. An embed model (`serving.task: embed`)
keeps no KV cache and decodes nothing: its memory is weights plus one step's activations
(`apps.core.sizing.embed`), its throughput the prompt tokens a replica embeds per second, and its
"streams" are inputs in flight (docs/planner.md, "Embedding models").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal, NamedTuple

from apps.core.errors import SpecError
from apps.core.sizing import embed, fleet, kv
from apps.core.spec import ModelSpec, Serving, StackSpec, parse_spec


@dataclass(frozen=True)
class ModelPlan:
    name: str
    gpu_type: str
    kv_bytes_per_token: int
    weights_gib: float
    gpus_per_replica: int
    kv_budget_gib_per_replica: float
    kv_blocks_per_replica: int
    planning_context_tokens: int
    max_model_len: int
    streams_per_replica: int  # streams that fit in KV at the planning context
    streams_target: int  # streams per replica the plan schedules (latency headroom)
    max_num_seqs: int
    peak_streams: int
    replicas: int
    min_replicas: int
    max_replicas: int
    gpus: int
    output_tokens_per_s_per_replica: float
    tokens_per_s_per_stream: float
    cost_per_million_tokens_usd: dict[str, float]
    queue: fleet.QueueBudget
    prefix_hit_rate: float = 0.0  # the share of prompt tokens served from the engines' prefix cache
    prompt_microcredits_per_million: int = 0  # what a team pays per million prompt tokens at that rate
    warnings: tuple[str, ...] = ()
    # A canary revision's floor (`models.<name>.canary.min_replicas` x GPUs per replica): its own
    # Deployment runs beside the stable one whatever the load, so the fleet's peak and cost count it.
    canary_gpus: int = 0
    # `serving.task`. For `embed` the KV fields are 0 (no KV cache), a stream is one input in flight,
    # `planning_context_tokens` its mean tokens, `tokens_per_s_per_stream` the prompt tokens per second
    # each input gets at the target, `cost_per_million_tokens_usd` per million prompt tokens and
    # `queue` the inputs' figures (service time = one input's latency at the target).
    task: Literal["generate", "embed"] = "generate"
    prompt_tokens_per_s_per_replica: float = 0.0  # embed: the spec's; generate: 0 (sized by decode)
    embedding_dimensions: int | None = None
    encoder_activation_gib: float = 0.0  # embed: one step's activations (within the stack's reserve)


@dataclass(frozen=True)
class FleetPlan:
    stack: str
    models: dict[str, ModelPlan]
    gpus_peak: int
    gpus_onprem: int
    gpus_cloud: int
    cost_per_hour_peak_usd: float
    average_cloud_gpus: float
    cost_per_month_usd: float
    queue_limit_s: float

    @property
    def warnings(self) -> list[str]:
        """Plan problems that are not input errors (the peak needs more replicas than the bounds allow)."""
        return [w for m in self.models.values() for w in m.warnings]

    def to_json(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "models": {name: asdict(m) for name, m in self.models.items()},
            "fleet": {
                "gpus_peak": self.gpus_peak,
                "gpus_onprem": self.gpus_onprem,
                "gpus_cloud": self.gpus_cloud,
                "cost_per_hour_peak_usd": self.cost_per_hour_peak_usd,
                "average_cloud_gpus": self.average_cloud_gpus,
                "cost_per_month_usd": self.cost_per_month_usd,
                "queue_limit_s": self.queue_limit_s,
            },
            "warnings": self.warnings,
        }


class _KvFit(NamedTuple):
    per_token: int  # KV bytes per token
    weights: float  # weight bytes
    tp: int  # GPUs per replica
    budget: float  # KV bytes per replica
    blocks: int
    fit: int  # streams of the planning context that fit


def _kv_fit(spec: StackSpec, name: str, model: ModelSpec) -> _KvFit:
    """The tensor-parallel size and KV cache of one replica, checked against the streams and the
    context the spec asks for (a SpecError naming the field when they do not fit)."""
    serving = model.serving
    gpu = spec.gpu_types[serving.gpu_type]
    sizing = spec.sizing
    mem = gpu.memory_gib * kv.GIB
    reserve = sizing.activation_reserve_gib_per_gpu * kv.GIB
    per_token = kv.kv_bytes_per_token(
        model.layers, model.kv_heads, model.head_dim, kv.dtype_bytes(model.kv_dtype, "kv_dtype")
    )
    weights = kv.weights_bytes(model.parameters_b * 1e9, model.weight_dtype)
    kv.check_context(serving.max_model_len, model.max_context, "max_model_len")
    target = _streams_target(serving)
    min_kv = target * kv.kv_bytes_for_context(per_token, serving.planning_context_tokens)
    tp = serving.tensor_parallel_size or kv.tensor_parallel_size(
        gpu_memory_bytes=mem,
        gpu_memory_utilization=sizing.gpu_memory_utilization,
        weights_bytes=weights,
        activation_reserve_bytes_per_gpu=reserve,
        min_kv_bytes=min_kv,
    )
    budget = kv.kv_budget_bytes(
        gpu_memory_bytes=mem,
        gpus=tp,
        gpu_memory_utilization=sizing.gpu_memory_utilization,
        weights_bytes=weights,
        activation_reserve_bytes_per_gpu=reserve,
    )
    blocks = kv.kv_blocks(budget, per_token, sizing.block_size)
    fit = kv.streams_that_fit(blocks, serving.planning_context_tokens, sizing.block_size)
    if fit < target:
        raise SpecError(
            f"models.{name}.serving.streams_per_replica: {target} streams of "
            f"{serving.planning_context_tokens} tokens do not fit in {budget / kv.GIB:.1f} GiB of KV cache "
            f"on {tp} GPU(s) (only {fit})",
            param=f"models.{name}.serving.streams_per_replica",
        )
    if blocks * sizing.block_size < serving.max_model_len:
        raise SpecError(
            f"models.{name}.serving.max_model_len: one {serving.max_model_len}-token sequence does not fit "
            f"in the KV cache ({blocks * sizing.block_size} tokens)",
            param=f"models.{name}.serving.max_model_len",
        )
    return _KvFit(per_token, weights, tp, budget, blocks, fit)


def _streams_target(serving: Serving) -> int:
    target = serving.streams_per_replica
    assert target is not None  # required for task: generate (Serving._task_fields)
    return target


def _replica_warnings(name: str, model: ModelSpec, replicas: int) -> list[str]:
    bounds = model.serving.replicas
    if bounds.min <= replicas <= bounds.max:
        return []
    return [
        f"models.{name}.serving.replicas: the peak needs {replicas} replicas, "
        f"outside [{bounds.min}, {bounds.max}]"
    ]


def plan_model(spec: StackSpec, name: str, model: ModelSpec) -> ModelPlan:
    if model.serving.task == "embed":
        return _plan_embed(spec, name, model)
    serving = model.serving
    gpu = spec.gpu_types[serving.gpu_type]
    per_token, weights, tp, budget, blocks, fit = _kv_fit(spec, name, model)
    target = _streams_target(serving)
    max_num_seqs = serving.max_num_seqs or max(kv.largest_power_of_two_at_most(fit), target)
    peak = spec.peak_streams.get(name, 0)
    replicas = fleet.replicas_for_load(peak, target, serving.headroom)
    bounds = serving.replicas
    warnings = _replica_warnings(name, model, replicas)
    tps = serving.output_tokens_per_s_per_replica
    assert tps is not None  # required for task: generate (Serving._task_fields)
    cost_full = fleet.cost_per_million_tokens(tp, gpu.price_per_gpu_hour_usd, tps, 1.0)
    cost_half = fleet.cost_per_million_tokens(tp, gpu.price_per_gpu_hour_usd, tps, 0.5)
    per_stream = tps / target
    return ModelPlan(
        name=name,
        gpu_type=serving.gpu_type,
        kv_bytes_per_token=per_token,
        weights_gib=weights / kv.GIB,
        gpus_per_replica=tp,
        kv_budget_gib_per_replica=budget / kv.GIB,
        kv_blocks_per_replica=blocks,
        planning_context_tokens=serving.planning_context_tokens,
        max_model_len=serving.max_model_len,
        streams_per_replica=fit,
        streams_target=target,
        max_num_seqs=max_num_seqs,
        peak_streams=peak,
        replicas=replicas,
        min_replicas=bounds.min,
        max_replicas=bounds.max,
        gpus=replicas * tp,
        output_tokens_per_s_per_replica=tps,
        tokens_per_s_per_stream=per_stream,
        cost_per_million_tokens_usd={"full": cost_full, "half": cost_half},
        queue=fleet.queue_budget(serving.mean_answer_tokens, per_stream, target, spec.slo.queue_limit_s),
        warnings=tuple(warnings),
        prefix_hit_rate=serving.prefix_hit_rate,
        prompt_microcredits_per_million=prompt_price_at(model, serving.prefix_hit_rate),
        canary_gpus=model.canary.min_replicas * tp if model.canary is not None else 0,
    )


class _EmbedFit(NamedTuple):
    weights: float  # weight bytes
    tp: int  # GPUs per replica
    activations: float  # one engine step's activation bytes


def _embed_fit(spec: StackSpec, name: str, model: ModelSpec) -> _EmbedFit:
    """GPUs per replica of an embed model: weights plus the activation reserve must fit, and one
    step's activations (an input of `max_model_len` tokens at most) must fit in that reserve."""
    serving = model.serving
    gpu = spec.gpu_types[serving.gpu_type]
    sizing = spec.sizing
    mem = gpu.memory_gib * kv.GIB
    reserve = sizing.activation_reserve_gib_per_gpu * kv.GIB
    weights = kv.weights_bytes(model.parameters_b * 1e9, model.weight_dtype)
    kv.check_context(serving.max_model_len, model.max_context, "max_model_len")
    tp = serving.tensor_parallel_size or kv.tensor_parallel_size(
        gpu_memory_bytes=mem,
        gpu_memory_utilization=sizing.gpu_memory_utilization,
        weights_bytes=weights,
        activation_reserve_bytes_per_gpu=reserve,
        min_kv_bytes=0,
    )
    # Raises when the weights plus the reserve do not fit on `tp` GPUs; what is left stays unused.
    kv.kv_budget_bytes(
        gpu_memory_bytes=mem,
        gpus=tp,
        gpu_memory_utilization=sizing.gpu_memory_utilization,
        weights_bytes=weights,
        activation_reserve_bytes_per_gpu=reserve,
    )
    # An encoder's attention is multi-head: its KV heads are all its heads, their widths the hidden size.
    tokens = embed.step_tokens(serving.max_model_len)
    activations = embed.encoder_step_activation_bytes(
        tokens, model.kv_heads * model.head_dim, kv.dtype_bytes(model.weight_dtype, "weight_dtype")
    )
    if activations > reserve * tp:
        raise SpecError(
            f"sizing.activation_reserve_gib_per_gpu: one step of models.{name} ({tokens} tokens) needs about "
            f"{activations / kv.GIB:.1f} GiB of activations, more than the {reserve * tp / kv.GIB:.1f} GiB "
            f"reserved on {tp} GPU(s)",
            param="sizing.activation_reserve_gib_per_gpu",
        )
    return _EmbedFit(weights, tp, activations)


def _slow_input(name: str, tokens: int, seconds: float, inputs: int, rate: float, target_s: float) -> str:
    return (
        f"models.{name}.serving: an input of {tokens} tokens takes {seconds:.1f} s when {inputs} share "
        f"{rate:,.0f} tokens/s, above the p95 TTFT target of {target_s:g} s"
    )


def _plan_embed(spec: StackSpec, name: str, model: ModelSpec) -> ModelPlan:
    """An embed model: no KV cache, no decode; sized by prompt tokens per second (its peak is inputs in
    flight, each replica holds the inputs it embeds within the stack's median TTFT target)."""
    serving = model.serving
    gpu = spec.gpu_types[serving.gpu_type]
    weights, tp, activations = _embed_fit(spec, name, model)
    rate = serving.prompt_tokens_per_s_per_replica
    assert rate is not None  # required for task: embed (Serving._task_fields)
    mean_input = serving.planning_context_tokens
    target = serving.streams_per_replica or embed.inputs_in_flight(rate, mean_input, spec.slo.ttft_p50_s)
    # The engine holds the inputs the plan schedules; more would only lengthen each one's latency
    # (a saturated replica embeds `rate` tokens/s however many share it): the rest waits in the
    # orchestrator's fair queue, which the autoscaler reads.
    max_num_seqs = serving.max_num_seqs or target
    peak = spec.peak_streams.get(name, 0)
    replicas = fleet.replicas_for_load(peak, target, serving.headroom)
    warnings = _replica_warnings(name, model, replicas)
    per_input = rate / target
    queue = fleet.queue_budget(mean_input, per_input, target, spec.slo.queue_limit_s)
    if (latency := queue.service_time_s) > spec.slo.ttft_p95_s:
        warnings.append(_slow_input(name, mean_input, latency, target, rate, spec.slo.ttft_p95_s))
    price = gpu.price_per_gpu_hour_usd
    return ModelPlan(
        name=name,
        gpu_type=serving.gpu_type,
        kv_bytes_per_token=0,
        weights_gib=weights / kv.GIB,
        gpus_per_replica=tp,
        kv_budget_gib_per_replica=0.0,
        kv_blocks_per_replica=0,
        planning_context_tokens=serving.planning_context_tokens,
        max_model_len=serving.max_model_len,
        streams_per_replica=max_num_seqs,  # no KV cache bounds it: the engine's own limit
        streams_target=target,
        max_num_seqs=max_num_seqs,
        peak_streams=peak,
        replicas=replicas,
        min_replicas=serving.replicas.min,
        max_replicas=serving.replicas.max,
        gpus=replicas * tp,
        output_tokens_per_s_per_replica=0.0,
        tokens_per_s_per_stream=per_input,
        cost_per_million_tokens_usd={
            "full": fleet.cost_per_million_tokens(tp, price, rate, 1.0),
            "half": fleet.cost_per_million_tokens(tp, price, rate, 0.5),
        },
        queue=queue,
        warnings=tuple(warnings),
        prefix_hit_rate=0.0,
        prompt_microcredits_per_million=prompt_price_at(model, 0.0),
        canary_gpus=model.canary.min_replicas * tp if model.canary is not None else 0,
        task="embed",
        prompt_tokens_per_s_per_replica=rate,
        embedding_dimensions=model.embedding_dimensions,
        encoder_activation_gib=activations / kv.GIB,
    )


def prompt_price_at(model: ModelSpec, hit_rate: float) -> int:
    """Microcredits per million prompt tokens when `hit_rate` of them are cached: the cached share
    at the cached-input price, the rest at the prompt price (as the settle bills them)."""
    prices = model.prices
    return round((1 - hit_rate) * prices.prompt_per_million_microcredits + hit_rate * prices.cached_prompt)


def plan_fleet(spec: StackSpec) -> FleetPlan:
    models = {name: plan_model(spec, name, model) for name, model in spec.models.items()}
    totals = fleet.fleet_totals({n: m.gpus + m.canary_gpus for n, m in models.items()}, spec.onprem_gpus)
    # One cloud GPU price: the fleet is priced at the GPU type most models use.
    prices = [spec.gpu_types[m.gpu_type].price_per_gpu_hour_usd for m in models.values()] or [0.0]
    price = max(set(prices), key=prices.count)
    return FleetPlan(
        stack=spec.name,
        models=models,
        gpus_peak=totals.gpus_peak,
        gpus_onprem=totals.gpus_onprem,
        gpus_cloud=totals.gpus_cloud,
        cost_per_hour_peak_usd=fleet.cost_per_hour(totals.gpus_cloud, price),
        average_cloud_gpus=spec.cost.average_cloud_gpus,
        cost_per_month_usd=fleet.cost_per_month(
            spec.cost.average_cloud_gpus, price, spec.cost.hours_per_month
        ),
        queue_limit_s=spec.slo.queue_limit_s,
    )


def with_overrides(
    spec: StackSpec,
    *,
    peak_streams: dict[str, int] | None = None,
    gpu_type: str | None = None,
    context_tokens: int | None = None,
    prefix_hit_rate: float | None = None,
) -> StackSpec:
    """What-if variants of a spec without editing the file (validated like the file)."""
    data = spec.model_dump()
    if peak_streams:
        for name in peak_streams:
            if name not in spec.models:
                raise SpecError(f"--streams: unknown model {name!r}", param="peak_streams")
        data["peak_streams"] = {**data["peak_streams"], **peak_streams}
    for model in data["models"].values():
        if gpu_type is not None:
            if gpu_type not in spec.gpu_types:
                known = ", ".join(spec.gpu_types)
                raise SpecError(
                    f"--gpu-type: unknown GPU type {gpu_type!r} (known: {known})", param="gpu_type"
                )
            model["serving"]["gpu_type"] = gpu_type
        if context_tokens is not None:
            model["serving"]["planning_context_tokens"] = context_tokens
            model["serving"]["max_model_len"] = max(model["serving"]["max_model_len"], context_tokens)
        if prefix_hit_rate is not None and model["serving"]["task"] != "embed":  # no prefix cache there
            model["serving"]["prefix_hit_rate"] = prefix_hit_rate
    return parse_spec(data, f"{spec.name} (what-if)")
