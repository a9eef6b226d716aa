"""The embedding a pooling enginesim answers for one input: deterministic, unit-norm, and shaped so
that texts sharing most of their words are close.

A vector is the sum of two parts, then L2-normalised and rounded to float32 (what vLLM sends, so the
`float` and `base64` encodings of one input agree exactly):

- the bag of words: every word (`\\w+`, lower-cased; a token id when the input is ids) adds +1 or
  -1 to `HASHES_PER_WORD` coordinates picked by its hash (feature hashing), once per occurrence.
  Two texts with mostly the same words point mostly the same way; unrelated texts are nearly
  orthogonal (a random word pair shares about `HASHES_PER_WORD² / dim` coordinates).
- the text itself: a pseudo-random direction seeded by the whole input, `TEXT_WEIGHT` of the bag's
  length, so two different texts never get the same vector (not even a reordering of the same
  words) while word overlap still dominates the cosine.

Cache tests can therefore check "semantically close" on enginesim with word overlap, e.g. "the
quick brown fox jumps" is closer to "the quick brown fox jumped" than to "quarterly tax filing".
"""

from __future__ import annotations

import hashlib
import math
import random
import re
import struct
from collections.abc import Sequence
from functools import lru_cache

HASHES_PER_WORD = 8
TEXT_WEIGHT = 0.25
_WORD_RE = re.compile(r"\w+")


def features(item: str | Sequence[int]) -> list[str]:
    """The words of a text (lower-cased), or the token ids of an id list, as hashing keys."""
    if isinstance(item, str):
        return [w.lower() for w in _WORD_RE.findall(item)]
    return [f"#{t}" for t in item]


@lru_cache(maxsize=65_536)
def _slots(feature: str, dim: int) -> tuple[tuple[int, float], ...]:
    """The (coordinate, sign) pairs one feature adds to."""
    digest = hashlib.blake2b(feature.encode(), digest_size=4 * HASHES_PER_WORD).digest()
    out = []
    for k in range(HASHES_PER_WORD):
        value = int.from_bytes(digest[4 * k : 4 * k + 4], "big")
        out.append((value % dim, 1.0 if value >> 31 else -1.0))
    return tuple(out)


def _text_direction(item: str | Sequence[int], dim: int) -> list[float]:
    basis = ("text:" + item) if isinstance(item, str) else ("ids:" + ",".join(map(str, item)))
    rng = random.Random(hashlib.sha256(basis.encode()).digest())
    return [rng.gauss(0.0, 1.0) for _ in range(dim)]


def _norm(vec: Sequence[float]) -> float:
    return math.sqrt(sum(v * v for v in vec))


def embed(item: str | Sequence[int], dim: int) -> list[float]:
    """The unit vector of `item` (a text or a list of token ids), `dim` float32 values."""
    if dim < 1:
        raise ValueError(f"the embedding dimension must be at least 1, got {dim}")
    bag = [0.0] * dim
    for feature in features(item):
        for index, sign in _slots(feature, dim):
            bag[index] += sign
    text = _text_direction(item, dim)
    bag_len, text_len = _norm(bag), _norm(text)
    scale = TEXT_WEIGHT * bag_len / text_len if bag_len > 0 else 1.0 / text_len
    vec = [b + t * scale for b, t in zip(bag, text, strict=True)]
    length = _norm(vec)
    return to_float32([v / length for v in vec])


def to_float32(vec: Sequence[float]) -> list[float]:
    """`vec` rounded to float32, as floats."""
    return list(struct.unpack(f"<{len(vec)}f", struct.pack(f"<{len(vec)}f", *vec)))


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / (_norm(a) * _norm(b))
