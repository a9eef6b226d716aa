"""KV-cache and weight memory arithmetic, the way vLLM does it.

Pure functions, no I/O. Sizes are bytes (int or float) unless a name says otherwise.
vLLM's rules this follows (see `docs/vllm-facts.md` §6):
KV bytes per token = 2 (K and V) x layers x kv_heads x head_dim x dtype bytes; the KV
budget is `memory x utilisation - weights - activations`; it is cut into blocks of
`block_size` tokens across all layers, `num_blocks = budget // (block_bytes)`; and
`kv_cache_usage_perc = used / (num_blocks - 1)` because one block is vLLM's null block.

These rules are for decoders. An encoder served for embeddings (`serving.task: embed`) keeps no
KV cache in vLLM 0.32 (its attention layers contribute no KV-cache group): the plan does not call
them for it (`apps.core.sizing.embed`), so no encoder is given KV blocks it would never allocate.
"""

from __future__ import annotations

import math

from apps.core.errors import SpecError

KIB = 1024
MIB = 1024**2
GIB = 1024**3
DEFAULT_BLOCK_SIZE = 16

DTYPE_BYTES: dict[str, float] = {
    "fp32": 4,
    "float32": 4,
    "bf16": 2,
    "bfloat16": 2,
    "fp16": 2,
    "float16": 2,
    "fp8": 1,
    "int8": 1,
    "int4": 0.5,
}


def _positive(value: float, field: str) -> None:
    if not value > 0:
        raise SpecError(f"{field} must be greater than 0, got {value}", param=field)


def _non_negative(value: float, field: str) -> None:
    if value < 0:
        raise SpecError(f"{field} must not be negative, got {value}", param=field)


def dtype_bytes(dtype: str, field: str = "dtype") -> float:
    """Bytes per value of a dtype name (`bf16`, `fp8`, ...)."""
    try:
        return DTYPE_BYTES[dtype.lower()]
    except KeyError:
        known = ", ".join(sorted(DTYPE_BYTES))
        raise SpecError(f"{field}: unknown dtype {dtype!r} (known: {known})", param=field) from None


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, kv_dtype_bytes: float = 2) -> int:
    """`2 x layers x kv_heads x head_dim x dtype_bytes`: the whole model's KV for one token."""
    _positive(layers, "layers")
    _positive(kv_heads, "kv_heads")
    _positive(head_dim, "head_dim")
    _positive(kv_dtype_bytes, "kv_dtype_bytes")
    return int(2 * layers * kv_heads * head_dim * kv_dtype_bytes)


def kv_bytes_for_context(bytes_per_token: int, context_tokens: int) -> int:
    _positive(bytes_per_token, "kv_bytes_per_token")
    _positive(context_tokens, "context_tokens")
    return bytes_per_token * context_tokens


def weights_bytes(parameters: float, weight_dtype: str) -> float:
    """Weight memory for `parameters` parameters (a count, not billions) in `weight_dtype`."""
    _positive(parameters, "parameters")
    return parameters * dtype_bytes(weight_dtype, "weight_dtype")


def kv_budget_bytes(
    *,
    gpu_memory_bytes: float,
    gpus: int,
    gpu_memory_utilization: float,
    weights_bytes: float,
    activation_reserve_bytes_per_gpu: float,
) -> float:
    """KV-cache memory of one replica: `memory x gpus x utilisation - weights - activations`.

    Raises `SpecError` when the weights (plus activations) do not fit at all.
    """
    _positive(gpu_memory_bytes, "gpu_memory")
    _positive(gpus, "gpus")
    if not 0 < gpu_memory_utilization <= 1:
        raise SpecError(
            f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}",
            param="gpu_memory_utilization",
        )
    _positive(weights_bytes, "weights")
    _non_negative(activation_reserve_bytes_per_gpu, "activation_reserve")
    usable = gpu_memory_bytes * gpus * gpu_memory_utilization
    budget = usable - weights_bytes - activation_reserve_bytes_per_gpu * gpus
    if budget <= 0:
        raise SpecError(
            f"weights: {weights_bytes / GIB:.1f} GiB of weights plus "
            f"{activation_reserve_bytes_per_gpu * gpus / GIB:.1f} GiB of activations do not fit in "
            f"{usable / GIB:.1f} GiB usable on {gpus} GPU(s)",
            param="weights",
        )
    return budget


def kv_blocks(budget_bytes: float, bytes_per_token: int, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """Number of KV blocks vLLM carves out of `budget_bytes` (floor, as `get_num_blocks`)."""
    _positive(budget_bytes, "kv_budget")
    _positive(bytes_per_token, "kv_bytes_per_token")
    _positive(block_size, "block_size")
    return int(budget_bytes // (bytes_per_token * block_size))


def blocks_for_tokens(tokens: int, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """Blocks one sequence of `tokens` tokens occupies (ceil)."""
    _non_negative(tokens, "tokens")
    _positive(block_size, "block_size")
    return -(-tokens // block_size)


def streams_that_fit(num_blocks: int, context_tokens: int, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """Concurrent sequences of `context_tokens` each that fit in `num_blocks` blocks."""
    _positive(context_tokens, "context_tokens")
    return num_blocks // blocks_for_tokens(context_tokens, block_size)


def kv_cache_usage_perc(used_blocks: int, num_blocks: int) -> float:
    """vLLM >= 0.9 semantics: fraction of usable blocks referenced (one null block excluded)."""
    if num_blocks < 2:
        raise SpecError(f"num_blocks must be at least 2, got {num_blocks}", param="num_blocks")
    if not 0 <= used_blocks <= num_blocks - 1:
        raise SpecError(
            f"used_blocks must be in [0, {num_blocks - 1}], got {used_blocks}", param="used_blocks"
        )
    return used_blocks / (num_blocks - 1)


def check_context(context_tokens: int, model_max_context: int, field: str = "context_tokens") -> None:
    """A context (or `--max-model-len`) longer than the model allows is an error."""
    _positive(context_tokens, field)
    if context_tokens > model_max_context:
        raise SpecError(
            f"{field} {context_tokens} is longer than the model allows ({model_max_context})", param=field
        )


def tensor_parallel_size(
    *,
    gpu_memory_bytes: float,
    gpu_memory_utilization: float,
    weights_bytes: float,
    activation_reserve_bytes_per_gpu: float,
    min_kv_bytes: float,
    max_gpus: int = 8,
) -> int:
    """Smallest power of two of GPUs whose memory holds the weights plus `min_kv_bytes` of KV cache."""
    _non_negative(min_kv_bytes, "min_kv_bytes")
    gpus = 1
    while gpus <= max_gpus:
        usable = gpu_memory_bytes * gpus * gpu_memory_utilization
        if usable - weights_bytes - activation_reserve_bytes_per_gpu * gpus >= min_kv_bytes:
            return gpus
        gpus *= 2
    raise SpecError(
        f"weights: {weights_bytes / GIB:.1f} GiB of weights plus {min_kv_bytes / GIB:.1f} GiB of KV cache "
        f"do not fit on {max_gpus} GPUs of {gpu_memory_bytes / GIB:.0f} GiB",
        param="weights",
    )


def largest_power_of_two_at_most(n: int) -> int:
    _positive(n, "n")
    return 1 << (n.bit_length() - 1)


def ceil_div(a: float, b: float) -> int:
    """`ceil(a / b)` that ignores float noise (140 x 1.3 / 32 must not become 6.0000001)."""
    return math.ceil(round(a / b, 9))
