"""Prefix affinity: which node's engine already holds the start of a request's prompt (issue 29).

The control plane never tokenizes. A conversation prefix is named by the text of its messages:
`prefix_keys` chains a hash over the request's messages, one key per message boundary, so the key
of `messages[:k]` is the same in every request that starts with those k messages (the turns
before, a shared system prompt). The agent, next to its engine, asks the engine's own tokenizer
which blocks such a prefix fills (`POST /tokenize`: its chat template, exactly) and announces
`key -> blocks`; the orchestrator keeps an announcement only while the node's KV events say the
engine still holds the prefix's last block (`apps/orchestrator/prefix_index.py`).

`prefix_score` is the scorer: among the nodes that may take the request, a node holding more of
its prefix sorts earlier, by up to `weight` of load (`apps.core.scheduling.scorers.load`, where 1.0
is every slot busy), unless its load runs `hot_margin` or more ahead of the least-loaded
candidate: then it gets no bonus, so one node is not made to take every request of a popular
prefix (the known failure of prefix-only routing).
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ROOT = b""  # the parent key of a prompt's first block


def block_key(parent: bytes, tokens: Sequence[int], extra: Sequence[Any] | None) -> bytes:
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(array("q", tokens).tobytes())
    if extra:
        h.update(json.dumps(list(extra), separators=(",", ":")).encode())
    return h.digest()


def block_keys(
    tokens: Sequence[int], block_size: int, first_extra: Sequence[Any] | None = None
) -> list[bytes]:
    """The keys of the full blocks of a token sequence, as the index keys stored blocks (`first_extra`:
    the first block's extra keys, e.g. its cache salt)."""
    keys: list[bytes] = []
    parent = ROOT
    for i in range(len(tokens) // block_size):
        parent = block_key(
            parent, tokens[i * block_size : (i + 1) * block_size], first_extra if i == 0 else None
        )
        keys.append(parent)
    return keys


MAX_BOUNDARIES = 64  # the last message boundaries looked up (a long chat shares its recent turns)


def _canonical(value: Any) -> bytes:
    """A message (or the tools list) as JSON with sorted keys, fields set to null left out (SDKs
    resend a response's message with `refusal: null` and the like: the same message)."""
    if isinstance(value, Mapping):
        value = {k: v for k, v in value.items() if v is not None}
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def team_scope(team_id: int) -> str:
    """A team's prefix-cache scope: the engine's `cache_salt` for its requests (`engine_body`) and the
    seed of its prefix keys. Teams never share cached prompt blocks: otherwise a team could learn,
    from `cached_tokens` or its time to first token, whether another team sent a given prompt (and
    prefix-aware picks would steer its probe to the node that holds it). A client cannot set the
    salt: the gateway never forwards a `cache_salt` (apps/gateway/fields.py)."""
    return f"team-{team_id}"


def prefix_keys(
    messages: Sequence[Mapping[str, Any]], tools: Any = None, scope: str | None = None
) -> list[str]:
    """The key of every prefix `messages[:k]`, k = 1..len(messages), in that order. Every field of a
    message counts (a `name`, `tool_calls`), and so do the request's `tools`: the chat template
    renders them into the prompt, so other tools make another prefix; and so does the team's
    `scope`: another team's same prompt is another prefix."""
    keys: list[str] = []
    chained = hashlib.blake2b(scope.encode(), digest_size=16).digest() if scope else b""
    if tools:
        chained = hashlib.blake2b(chained + _canonical(tools), digest_size=16).digest()
    for message in messages:
        chained = hashlib.blake2b(chained + _canonical(message), digest_size=16).digest()
        keys.append(chained.hex())
    return keys


def lookup_keys(
    messages: Sequence[Mapping[str, Any]], tools: Any = None, scope: str | None = None
) -> list[str]:
    """The prefixes worth looking up for a request, longest first (at most `MAX_BOUNDARIES`)."""
    return prefix_keys(messages, tools, scope)[::-1][:MAX_BOUNDARIES]


@dataclass(frozen=True)
class PrefixWeights:
    weight: float = 0.5  # the most load a whole-prefix match outweighs
    hot_margin: float = 0.5  # load ahead of the least-loaded candidate past which no bonus is given


def prefix_bonus(
    matched: Mapping[str, int], loads: Mapping[str, float], weights: PrefixWeights
) -> dict[str, float]:
    """The load each node's match takes off its score: `weight` times its matched blocks over the best
    match among the candidates, none for a node running `hot_margin` ahead of the least loaded."""
    best = max((matched.get(n, 0) for n in loads), default=0)
    if best <= 0 or not loads:
        return {}
    floor = min(loads.values())
    return {
        node: weights.weight * matched.get(node, 0) / best
        for node, load in loads.items()
        if matched.get(node, 0) > 0 and load - floor < weights.hot_margin
    }


def chat_messages(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A chat body's messages (none for anything else: no prefix to look up)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    return [m for m in messages if isinstance(m, Mapping)]


def prefix_outcome(matched: Mapping[str, int], node_id: str) -> str:
    """The pick's outcome for the hit-rate metric: hit, miss (another node held some) or none."""
    if matched.get(node_id, 0) > 0:
        return "hit"
    return "miss" if any(v > 0 for v in matched.values()) else "none"
