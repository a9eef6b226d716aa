"""The simulator's tokenizer rule and its deterministic output text.

Prompt tokens (documented rule, no real tokenizer): a piece of text counts one token per word
(`\\w+`) and one per other non-space character. A chat prompt is rendered like the tiny Llama's
chat template of the conformance suite, `<s>` then per message `<|role|> \\n content </s> \\n`, then
`<|assistant|> \\n` for the generation prompt, so

    prompt_tokens = 1 + sum(4 + tokens(content) for each message) + 2

Output: each token is one word (with its leading space) drawn from a fixed vocabulary by a PRNG
seeded from the request's `seed` (or the server's `--seed`) and the prompt, so the same request
gives the same text on every run.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from typing import Any

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")
BOS, EOS = "<s>", "</s>"
VOCAB = 2048

WORDS: tuple[str, ...] = tuple(
    [
        "the",
        "of",
        "and",
        "to",
        "in",
        "a",
        "is",
        "that",
        "for",
        "it",
        "as",
        "was",
        "with",
        "be",
        "by",
        "on",
        "not",
        "he",
        "this",
        "are",
        "or",
        "his",
        "from",
        "at",
        "which",
        "but",
        "have",
        "an",
        "they",
        "you",
        "were",
        "her",
        "she",
        "there",
        "been",
        "one",
        "all",
        "we",
        "their",
        "has",
        "would",
        "when",
        "if",
        "so",
        "no",
        "will",
        "more",
        "can",
        "about",
        "out",
        "up",
        "them",
        "some",
        "could",
        "what",
        "into",
        "time",
        "only",
        "other",
        "new",
        "like",
        "then",
        "its",
        "also",
        "two",
        "may",
        "first",
        "any",
        "these",
        "people",
        "over",
        "such",
        "most",
        "after",
        "well",
        "made",
        "where",
        "did",
        "through",
        "many",
        "before",
        "must",
        "down",
        "should",
        "because",
        "each",
        "just",
        "those",
        "much",
        "how",
        "years",
        "world",
        "good",
        "work",
        "still",
        "under",
        "long",
        "day",
        "even",
        "life",
        "back",
        "system",
        "model",
        "token",
        "stream",
        "engine",
        "cache",
        "block",
        "queue",
        "batch",
        "request",
        "answer",
        "river",
        "mountain",
        "garden",
        "light",
        "paper",
        "window",
        "music",
        "orange",
        "silver",
        "quiet",
        "bright",
        "simple",
        "careful",
    ]
)


def count_text_tokens(text: str) -> int:
    return len(_TOKEN_RE.findall(text))


def text_tokens(text: str) -> list[str]:
    return _TOKEN_RE.findall(text)


def message_text(content: Any) -> str:
    """Text of a message `content`: a string or a list of `{"type": "text", "text": ...}` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for part in content:
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            parts.append(part["text"])
    return "".join(parts)


def chat_prompt_pieces(
    messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True, *, continue_final: bool = False
) -> list[str]:
    """The rendered prompt. `continue_final` (vLLM's `continue_final_message`): the text stops right
    after the last message's content (no end of message), as transformers truncates the template."""
    pieces = [BOS]
    for msg in messages:
        pieces += [
            f"<|{msg.get('role', 'user')}|>",
            "\n",
            *text_tokens(message_text(msg.get("content"))),
            EOS,
        ]
        pieces.append("\n")
    if continue_final and messages:
        return pieces[:-2]
    if add_generation_prompt:
        pieces += ["<|assistant|>", "\n"]
    return pieces


def chat_prompt_tokens(
    messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True, *, continue_final: bool = False
) -> int:
    return len(chat_prompt_pieces(messages, add_generation_prompt, continue_final=continue_final))


def token_ids(pieces: Sequence[str]) -> list[int]:
    """Stable fake token ids (what `/tokenize` returns); specials get vLLM-like small ids."""
    specials = {"<unk>": 0, BOS: 1, EOS: 2, "<pad>": 3, "<|user|>": 4, "<|assistant|>": 5, "<|system|>": 6}
    out = []
    for p in pieces:
        if p in specials:
            out.append(specials[p])
        else:
            digest = hashlib.blake2b(p.encode(), digest_size=4).digest()
            out.append(7 + int.from_bytes(digest, "big") % (VOCAB - 7))
    return out


def answer_token_ids(words: Sequence[str]) -> list[int]:
    """The ids of an answer's tokens (one word each; "" is the EOS token), as `token_ids` gives
    the same text in a later prompt: a conversation's next turn shares the answer's cached blocks."""
    out: list[int] = []
    for word in words:
        pieces = text_tokens(word) if word else [EOS]
        out.extend(token_ids(pieces[:1] or [EOS]))
    return out


def output_rng(server_seed: int, request_seed: int | None, prompt_fingerprint: str) -> random.Random:
    basis = f"{server_seed}:{request_seed}:{prompt_fingerprint}"
    return random.Random(hashlib.sha256(basis.encode()).digest())


def prompt_fingerprint(messages: Sequence[dict[str, Any]]) -> str:
    h = hashlib.sha256()
    for msg in messages:
        h.update(str(msg.get("role")).encode())
        h.update(b"\0")
        h.update(message_text(msg.get("content")).encode())
        h.update(b"\1")
    return h.hexdigest()


def generate_words(rng: random.Random, count: int) -> list[str]:
    return [" " + rng.choice(WORDS) for _ in range(count)]


def continue_from(rng: random.Random, given: str) -> int | None:
    """Advance `rng` past `given` when it is the beginning of the answer `rng` draws (one word a
    token): the number of tokens it holds; None (rng state undefined) when it is not."""
    text = ""
    count = 0
    while len(text) < len(given):
        text += generate_words(rng, 1)[0]
        count += 1
        if not given.startswith(text):
            return None
    return count


def natural_length(rng: random.Random, mean: int) -> int:
    """Where the model would emit EOS on its own: geometric with the profile's mean, at least 1."""
    p = 1.0 / max(mean, 1)
    n = 1
    while rng.random() > p and n < 1_000_000:
        n += 1
    return n
