"""Prompts given as text or token ids (a legacy completion's `prompt`, an embedding's `input`) as
vLLM 0.32's renderer and engine input processor see them (measured: `docs/enginesim.md`, "Legacy
completions and embeddings").

- One string or one list of ids is one prompt; a list of them is several (`prompt_list`, vLLM's
  `prompt_to_seq`); an empty list is no prompt ("You must pass at least one prompt").
- A text counts enginesim's tokens (`textgen.text_tokens`: words and punctuation) and nothing more:
  the tiny test model's tokenizer adds no BOS, whatever `add_special_tokens` says (measured: "hi" is
  1 token, "" none). Token ids are counted as given.
- The renderer's context check (`too_long`): a text is tokenized up to `max_model_len + 1` tokens
  ("at least"), ids are counted whole.
- The engine's input checks (`engine_rejection`), which vLLM runs only when the request reaches the
  engine (a stream has already answered 200: the error is an event in it): an empty prompt, then
  an id outside the vocabulary (`textgen.VOCAB`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from apps.enginesim import textgen
from apps.enginesim.errors import VllmError, bad_request, prompt_too_long


@dataclass(frozen=True)
class Prompt:
    tokens: int
    ids: tuple[int, ...]  # what prefix caching hashes
    fingerprint: str  # what seeds its answers, or its vector
    text: str | None = None  # given as text (else as token ids)

    @property
    def source(self) -> str | tuple[int, ...]:
        return self.text if self.text is not None else self.ids


class EngineInputError(VllmError):
    """A 400 from vLLM's engine input processor: a non-streamed request gets it as its answer, a
    stream as an error event after its 200 (`data: {"error": ...}` then `[DONE]`)."""

    stream: bool = False  # the request asked for a stream


NO_PROMPT = "You must pass at least one prompt"


def prompt_list(value: Any) -> list[str | list[int]]:
    """vLLM's `prompt_to_seq`: one string or one (non-empty) id list is one prompt; a list is several."""
    if isinstance(value, str) or (value and all(isinstance(t, int) for t in value)):
        return [value]
    return list(value)


def tokenized(value: str | list[int]) -> Prompt:
    if isinstance(value, str):
        ids = tuple(textgen.token_ids(textgen.text_tokens(value)))
        basis, text = "text:" + value, value
    else:
        ids = tuple(value)
        basis, text = "ids:" + ",".join(map(str, ids)), None
    return Prompt(len(ids), ids, hashlib.sha256(basis.encode()).hexdigest(), text)


def too_long(prompt: Prompt, max_model_len: int) -> VllmError | None:
    if prompt.tokens <= max_model_len:
        return None
    count = min(prompt.tokens, max_model_len + 1) if prompt.text is not None else prompt.tokens
    return prompt_too_long(max_model_len, count)


def engine_rejection(prompt: Prompt) -> EngineInputError | None:
    """What vLLM's input processor refuses in a prompt (None: nothing)."""
    if prompt.tokens == 0:
        return EngineInputError(400, "BadRequestError", "The decoder prompt cannot be empty")
    if prompt.text is None:
        low, high = min(prompt.ids), max(prompt.ids)
        bad = low if low < 0 else high if high >= textgen.VOCAB else None
        if bad is not None:
            return EngineInputError(400, "BadRequestError", f"Token id {bad} is out of vocabulary")
    return None


def no_prompt() -> VllmError:
    return bad_request(NO_PROMPT)
