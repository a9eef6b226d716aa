"""The ONE place where enginesim and the real vLLM legitimately differ; tests branch only on these.

- Text: the real model is random weights with a BPE tokenizer, enginesim emits words. Tests never
  compare text across engines, only shape, counts and determinism per engine.
- Timing: the real server runs on a shared CPU; tests assert no latencies.
- Chunk merging: vLLM may merge several tokens into one chunk when its HTTP side falls behind
  (`docs/vllm-facts.md` §2); enginesim always sends one chunk per token.
- `kv_cache_usage_perc` on the real CPU server is often 0.0 between steps and `/metrics` answers
  slowly under load (measured on 0.32: `docs/vllm-facts.md` §5), so only enginesim must show it moving.
- Embedding values: the real pooling model is random weights, enginesim hashes words
  (`apps/enginesim/vectors.py`). Both give deterministic unit vectors of the hidden size; only
  enginesim promises that texts sharing most words are closer than unrelated ones.
- Embedding validation messages: vLLM's embedding request is a union of five request models and
  lists each one's errors ("7 validation errors" for a missing `input`); enginesim lists those of
  the text-input model only. Type, `param` and the first error line agree; tests compare those.
- Token counts: enginesim counts words and punctuation, the tiny model's BPE counts pieces; tests
  compare each engine's usage with its own `/tokenize`, never counts across engines.
- Abort race: the tiny real model makes ~800 tokens/s, a delayed client may see the request finish
  before its disconnect arrives (`docs/vllm-facts.md` §4); enginesim at speed 1 is slower to
  finish 1,000 tokens, so its abort must always cut generation short.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineTraits:
    one_chunk_per_token: bool
    kv_usage_observable_under_load: bool
    abort_always_beats_completion: bool
    semantic_embeddings: bool = False


ENGINE_TRAITS = {
    "enginesim": EngineTraits(
        one_chunk_per_token=True,
        kv_usage_observable_under_load=True,
        abort_always_beats_completion=True,
        semantic_embeddings=True,
    ),
    "vllm": EngineTraits(
        one_chunk_per_token=False, kv_usage_observable_under_load=False, abort_always_beats_completion=False
    ),
}
