"""The engine's body: built once, from an assignment (issue 28).

The gateway forwards the client's body (its OpenAI fields and allowed engine extras only) and
states its intent in the dispatch request; the orchestrator passes both on in `assign`
(`apps/orchestrator/routing.py` `assignment`), a resumed stream with a `Budget` remainder and the
text to continue; the agent builds the body the engine gets with `engine_body`
(`apps/agent/relay.py`). Nothing else edits it.

What it sets: the model; `max_tokens` (and `max_completion_tokens` when the client used it: vLLM
prefers it, both say the same) and `n` from the budget, so the engine never produces more than
the reservation covers; vLLM's per-request `priority` from the class; streaming with usage on, on
every chunk too (measured on vLLM 0.32: `{}` gives no usage, docs/vllm-facts.md §2; the agent cuts
the per-chunk usage out of the forwarded bytes unless `wants_chunk_usage`); and for a continuation
the delivered text as a final assistant message, `continue_final_message: true`,
`add_generation_prompt: false`; and the team's prefix-cache scope as vLLM's `cache_salt` (the
gateway never forwards a client's own), so cached prompt blocks are shared within a team only.

Per endpoint (issue 31, `Assign.endpoint`): a completion (`/v1/completions`) is streamed like a chat
completion; a resumed one continues its `prompt` (a single string) with the delivered text. An
embedding request (`/v1/embeddings`) is not streamed and has no output budget: its body gets the
model, the priority and the cache scope only.
"""

from __future__ import annotations

from typing import Any

from apps.core.protocol.node import INTENT_FIELDS, Assign
from apps.core.sharing import VLLM_PRIORITY

# The engine's path of each endpoint (`Assign.endpoint`; None: chat).
ENGINE_PATHS = {
    None: "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
}


def engine_body(assign: Assign) -> dict[str, Any]:
    body = dict(assign.body)
    body["model"] = assign.model
    if assign.priority_class is not None:
        body["priority"] = VLLM_PRIORITY[assign.priority_class]
    if assign.cache_scope is not None:
        body["cache_salt"] = assign.cache_scope
    if assign.endpoint == "embeddings":
        return body
    budget = assign.budget
    if budget is not None and budget.max_tokens is not None:
        body["max_tokens"] = budget.max_tokens
        if "max_completion_tokens" in body:
            body["max_completion_tokens"] = budget.max_tokens
        body["n"] = budget.n
    if assign.continuation is not None:
        if assign.endpoint == "completions":
            body["prompt"] = f"{body['prompt']}{assign.continuation}"
        else:
            body["messages"] = [*body["messages"], {"role": "assistant", "content": assign.continuation}]
            body["add_generation_prompt"] = False
            body["continue_final_message"] = True
    body["stream"] = True
    options = body.get("stream_options")
    options = dict(options) if isinstance(options, dict) else {}
    options["include_usage"] = True
    options["continuous_usage_stats"] = True
    body["stream_options"] = options
    return body


def wants_chunk_usage(assign: Assign) -> bool:
    """The client asked for per-chunk usage itself: the intent, or (from an orchestrator older than
    version 4) the option left in the body, which was there only then."""
    if assign.wants_chunk_usage is not None:
        return assign.wants_chunk_usage
    options = assign.body.get("stream_options")
    return isinstance(options, dict) and options.get("continuous_usage_stats") is True


def legacy_assign(assign: Assign) -> Assign:
    """The assignment for a node older than protocol version 4: the engine's body built here (the
    per-chunk usage option only when the client asked for it, as that agent reads it) and no
    intent fields, which it would refuse."""
    if all(getattr(assign, name) is None for name in INTENT_FIELDS):
        return assign
    body = engine_body(assign)
    if not wants_chunk_usage(assign):
        body["stream_options"].pop("continuous_usage_stats", None)
    return Assign(request_id=assign.request_id, model=assign.model, body=body)
