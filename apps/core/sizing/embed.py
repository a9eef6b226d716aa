"""Sizing arithmetic of an embedding model (`serving.task: embed`, vLLM's pooling runner). Pure.

An encoder (BERT, XLM-RoBERTa: bidirectional attention) keeps no KV cache in vLLM 0.32: its
`EncoderOnlyAttention` layers contribute no KV-cache group, so a replica's memory is its weights
plus the activations of one engine step, and its capacity is its prompt-token throughput: the
inputs in flight it holds are those it embeds within a latency target (`inputs_in_flight`, used by
`apps.core.sizing.plan`). A pooling model with bidirectional attention is not chunk-prefilled, so
every input is prefilled whole in one step, and vLLM raises the step's token budget
(`--max-num-batched-tokens`) to at least `--max-model-len` (`EngineArgs`: `max(max_model_len,
default)`, the default being 2048 tokens on GPUs under 70 GiB such as the L40S).
"""

from __future__ import annotations

import math

from apps.core.errors import SpecError

# vLLM's default step budget on GPUs under 70 GiB (EngineArgs.get_batch_defaults, API server).
DEFAULT_STEP_TOKENS = 2048
# Hidden-size-wide values per token alive together at the peak of one encoder layer: the layer's
# input and its residual (2), the Q, K and V projections (3), the attention output (1) and the
# feed-forward's up projection and its activation (2 x 4: the BERT family's 4 x hidden FFN).
ENCODER_LIVE_WIDTHS = 14


def step_tokens(max_model_len: int) -> int:
    """Tokens one engine step of an encoder holds at most: vLLM's budget, never under one input."""
    if max_model_len <= 0:
        raise SpecError(f"max_model_len must be greater than 0, got {max_model_len}", param="max_model_len")
    return max(max_model_len, DEFAULT_STEP_TOKENS)


def encoder_step_activation_bytes(tokens: int, hidden_size: int, dtype_bytes: float) -> float:
    """Activation memory of one encoder step of `tokens` tokens (layers run one after another, so
    one layer's peak is the step's): `tokens x ENCODER_LIVE_WIDTHS x hidden_size x dtype bytes`.
    Attention scores are not materialised (vLLM's encoder attention runs a fused kernel)."""
    for value, field in ((tokens, "tokens"), (hidden_size, "hidden_size"), (dtype_bytes, "dtype_bytes")):
        if not value > 0:
            raise SpecError(f"{field} must be greater than 0, got {value}", param=field)
    return tokens * ENCODER_LIVE_WIDTHS * hidden_size * dtype_bytes


def inputs_in_flight(prompt_tokens_per_s: float, mean_input_tokens: int, latency_s: float) -> int:
    """Inputs in flight a replica embedding `prompt_tokens_per_s` holds so that each input of
    `mean_input_tokens` is done within `latency_s` (they share the rate): `floor(rate x latency /
    tokens)`, at least 1. By Little's law, `peak inputs in flight / this` replicas embed the peak's
    prompt tokens per second (`peak x tokens / latency`) at `prompt_tokens_per_s` each: the replicas
    are sized by prompt tokens per second."""
    for value, field in (
        (prompt_tokens_per_s, "prompt_tokens_per_s_per_replica"),
        (mean_input_tokens, "planning_context_tokens"),
        (latency_s, "latency_s"),
    ):
        if not value > 0:
            raise SpecError(f"{field} must be greater than 0, got {value}", param=field)
    return max(1, math.floor(round(prompt_tokens_per_s * latency_s / mean_input_tokens, 9)))
