"""Engine profiles: the KV-block budget, batch limits and step timing of one simulated replica.

Catalog profiles come from the stack spec through the sizing library (`apps.core.sizing.plan`),
so the simulator carves exactly the number of KV blocks the planner prints and vLLM would
allocate. Timing is calibrated from the spec's serving targets:

    step_s(batch, prefill_tokens) = base_s + per_seq_s * batch + prefill_s_per_token * prefill_tokens

With `base_s = 0.75 / r` and `per_seq_s = 0.25 / (r * target)` where `r` is the per-stream token
rate at the planned streams per replica (`output_tokens_per_s_per_replica / streams_per_replica`),
a decode step at the target batch takes exactly `1 / r`: for the 8B model 21.3 ms, i.e. 46.9
tokens/s per stream and 1,500 tokens/s per replica at 32 streams (the brief). Throughput grows
with batch size and per-stream speed falls, as on a real GPU. The prefill cost is the roofline
estimate `2 x parameters` FLOP per prompt token at half of the GPU's dense peak
(`docs/vllm-facts.md` §7.1; L40S 362 TFLOPS BF16, 2x for FP8 weights).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from apps.core.errors import SpecError
from apps.core.sizing.plan import plan_fleet
from apps.core.spec import StackSpec, load_spec

L40S_DENSE_BF16_FLOPS = 362e12
PREFILL_EFFICIENCY = 0.5
BASE_SHARE = 0.75  # share of a target-batch step that does not depend on batch size (weight reads)
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048  # vLLM's default on GPUs under 70 GiB (L40S)


@dataclass(frozen=True)
class EngineProfile:
    name: str
    root: str  # what `/v1/models` reports as `root` (the model path vLLM was started with)
    num_blocks: int
    block_size: int
    max_num_seqs: int
    max_model_len: int
    max_num_batched_tokens: int
    base_s: float
    per_seq_s: float
    prefill_s_per_token: float
    mean_answer_tokens: int  # mean length of a "natural" answer (EOS) when ignore_eos is off

    def step_s(self, batch: int, prefill_tokens: int) -> float:
        """Simulated duration of one engine step."""
        return self.base_s + self.per_seq_s * batch + self.prefill_s_per_token * prefill_tokens

    def decode_tokens_per_s_per_stream(self, batch: int) -> float:
        return 1.0 / self.step_s(batch, 0)

    def with_overrides(
        self,
        *,
        max_num_seqs: int | None = None,
        max_model_len: int | None = None,
        num_blocks: int | None = None,
        max_num_batched_tokens: int | None = None,
    ) -> EngineProfile:
        """A copy with CLI overrides applied; the same validation as vLLM's start-up."""
        prof = replace(
            self,
            max_num_seqs=max_num_seqs or self.max_num_seqs,
            max_model_len=max_model_len or self.max_model_len,
            num_blocks=num_blocks or self.num_blocks,
            max_num_batched_tokens=max_num_batched_tokens or self.max_num_batched_tokens,
        )
        if prof.max_num_batched_tokens < 1:
            raise SpecError(
                f"max_num_batched_tokens must be at least 1, got {prof.max_num_batched_tokens}",
                param="max_num_batched_tokens",
            )
        if prof.num_blocks < 2:
            raise SpecError(f"num_blocks must be at least 2, got {prof.num_blocks}", param="num_blocks")
        if (prof.num_blocks - 1) * prof.block_size < prof.max_model_len:
            raise SpecError(
                f"max_model_len: one {prof.max_model_len}-token sequence does not fit in the KV cache "
                f"({(prof.num_blocks - 1) * prof.block_size} tokens); lower --max-model-len",
                param="max_model_len",
            )
        return prof


_ROOTS = {
    "llama-3.1-8b-instruct": "meta-llama/Llama-3.1-8B-Instruct",
    "qwen2.5-32b-instruct": "Qwen/Qwen2.5-32B-Instruct",
    "llama-3.3-70b-instruct-fp8": "RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic",
}


def catalog_profiles(stack: str | Path = "prod") -> dict[str, EngineProfile]:
    """One profile per model of the stack, sized by the planner."""
    return profiles_for(load_spec(stack))


def profiles_for(spec: StackSpec) -> dict[str, EngineProfile]:
    """One profile per model of a loaded spec, sized by the planner."""
    plan = plan_fleet(spec)
    out: dict[str, EngineProfile] = {}
    for name, mp in plan.models.items():
        model = spec.models[name]
        rate = mp.tokens_per_s_per_stream
        target = mp.streams_target
        step_at_target = 1.0 / rate
        fp8 = 2.0 if model.weight_dtype.lower() == "fp8" else 1.0
        flops_per_s = L40S_DENSE_BF16_FLOPS * PREFILL_EFFICIENCY * mp.gpus_per_replica * fp8
        num_blocks = mp.kv_blocks_per_replica
        if model.serving.task == "embed":
            # vLLM keeps no KV cache for an encoder (the plan says 0 blocks); enginesim's scheduler still
            # places a prompt in blocks while it embeds it: room for one of the longest (and the null block).
            num_blocks = max(num_blocks, -(-mp.max_model_len // spec.sizing.block_size) + 1)
        out[name] = EngineProfile(
            name=name,
            root=_ROOTS.get(name, name),
            num_blocks=num_blocks,
            block_size=spec.sizing.block_size,
            max_num_seqs=mp.max_num_seqs,
            max_model_len=mp.max_model_len,
            max_num_batched_tokens=DEFAULT_MAX_NUM_BATCHED_TOKENS,
            base_s=step_at_target * BASE_SHARE,
            per_seq_s=step_at_target * (1 - BASE_SHARE) / target,
            prefill_s_per_token=2 * model.parameters_b * 1e9 / flops_per_s,
            mean_answer_tokens=model.serving.mean_answer_tokens,
        )
    return out
