"""The engine simulator's profiles: the catalog of the stack (`apps.core.batching.profile`) plus
the small `tiny` profile of the tests."""

from __future__ import annotations

from pathlib import Path

from apps.core.batching.profile import EngineProfile, catalog_profiles
from apps.core.errors import SpecError

__all__ = ["TINY", "EngineProfile", "catalog_profiles", "get_profile", "known_profiles"]

# The small profile used by tests; shaped like the real tiny vLLM of the conformance suite
# (`--max-model-len 1024 --max-num-seqs 8`, about 800-900 tokens/s for one stream on CPU).
TINY = EngineProfile(
    name="tiny",
    root="tiny-llama",
    num_blocks=4096,
    block_size=16,
    max_num_seqs=8,
    max_model_len=1024,
    max_num_batched_tokens=2048,
    base_s=0.001,
    per_seq_s=0.0001,
    prefill_s_per_token=0.000005,
    mean_answer_tokens=64,
)


def known_profiles(stack: str | Path = "prod") -> dict[str, EngineProfile]:
    return {**catalog_profiles(stack), TINY.name: TINY}


def get_profile(name: str, stack: str | Path = "prod") -> EngineProfile:
    """The named profile, or a `SpecError` that lists the known ones."""
    profiles = known_profiles(stack)
    try:
        return profiles[name]
    except KeyError:
        known = ", ".join(sorted(profiles))
        raise SpecError(f"unknown profile {name!r} (known profiles: {known})", param="profile") from None
