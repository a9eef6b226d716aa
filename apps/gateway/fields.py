"""Which fields of a request reach the engine: the OpenAI Chat Completions fields (the legacy
Completions' and Embeddings' fields for those endpoints), plus an explicit allowlist of engine
sampling extras. Every other top-level field is dropped before the
body leaves the gateway, so engine-only controls (`kv_transfer_params`, `chat_template`,
`chat_template_kwargs`, `logits_processors`, `mm_processor_kwargs`, `priority`, `request_id`,
`guided_*`/`structured_outputs`, `best_of`, ...) can never be set by a client.

The engine extras allowed (vLLM's sampling parameters; docs/security.md lists them too):
`top_k`, `min_p`, `repetition_penalty`, `length_penalty`, `min_tokens`, `ignore_eos`,
`stop_token_ids`, `include_stop_str_in_output`, `skip_special_tokens`,
`spaces_between_special_tokens`. To allow another one, add it here with a reason.
"""

from __future__ import annotations

from typing import Any

OPENAI_CHAT_FIELDS = frozenset(
    {
        "model", "messages", "audio", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs",
        "max_tokens", "max_completion_tokens", "metadata", "modalities", "n", "parallel_tool_calls",
        "prediction", "presence_penalty", "reasoning_effort", "response_format", "seed", "service_tier",
        "stop", "store", "stream", "stream_options", "temperature", "top_p", "tools", "tool_choice",
        "user", "functions", "function_call", "web_search_options",
    }
)  # fmt: skip
ENGINE_SAMPLING_EXTRAS = frozenset(
    {
        "top_k", "min_p", "repetition_penalty", "length_penalty", "min_tokens", "ignore_eos",
        "stop_token_ids", "include_stop_str_in_output", "skip_special_tokens",
        "spaces_between_special_tokens",
    }
)  # fmt: skip
FORWARDED_FIELDS = OPENAI_CHAT_FIELDS | ENGINE_SAMPLING_EXTRAS
# `/v1/completions` (issue 31): OpenAI's legacy completion fields (not `best_of`, which makes the
# engine generate more than the budget's `n` choices) and the same engine extras.
OPENAI_COMPLETION_FIELDS = frozenset(
    {
        "model", "prompt", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
        "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature",
        "top_p", "user",
    }
)  # fmt: skip
# `/v1/embeddings`: OpenAI's fields only.
OPENAI_EMBEDDING_FIELDS = frozenset({"model", "input", "encoding_format", "dimensions", "user"})
FORWARDED_BY_ENDPOINT = {
    "chat": FORWARDED_FIELDS,
    "completions": OPENAI_COMPLETION_FIELDS | ENGINE_SAMPLING_EXTRAS,
    "embeddings": OPENAI_EMBEDDING_FIELDS,
}


def forwarded(body: dict[str, Any], endpoint: str = "chat") -> dict[str, Any]:
    """The fields of `body` the engine may see at `endpoint` (a new dict; `body` is unchanged)."""
    allowed = FORWARDED_BY_ENDPOINT[endpoint]
    return {k: v for k, v in body.items() if k in allowed}
