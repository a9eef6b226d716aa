"""A policy's guard model, as pure functions: the chat body that asks a model of the stack whether a
conversation's last user message (input) or the answer (output) is safe, and the reading of its verdict
in Llama Guard's form (first line `safe` or `unsafe`, then the violated categories). The call itself is
the gateway's.

Two templates (`GuardModelSpec.template`):
- `instruct`: any instruct model; one user message holding `INSTRUCT_TEMPLATE` (Llama Guard 3's own task
  text with the MLCommons hazard categories S1-S14), the conversation quoted in it;
- `llama_guard`: a Llama Guard model, whose chat template writes that task itself: the conversation is
  sent as its user and assistant turns.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from apps.core.guardrails.decisions import Decision, Direction
from apps.core.guardrails.policy import GuardModelSpec

CATEGORIES = (
    ("S1", "Violent Crimes"),
    ("S2", "Non-Violent Crimes"),
    ("S3", "Sex-Related Crimes"),
    ("S4", "Child Sexual Exploitation"),
    ("S5", "Defamation"),
    ("S6", "Specialized Advice"),
    ("S7", "Privacy"),
    ("S8", "Intellectual Property"),
    ("S9", "Indiscriminate Weapons"),
    ("S10", "Hate"),
    ("S11", "Suicide & Self-Harm"),
    ("S12", "Sexual Content"),
    ("S13", "Elections"),
    ("S14", "Code Interpreter Abuse"),
)
INSTRUCT_TEMPLATE = """Task: Check if there is unsafe content in '{role}' messages in conversations according to our \
safety policy with the below categories.

<BEGIN UNSAFE CONTENT CATEGORIES>
{categories}
<END UNSAFE CONTENT CATEGORIES>

<BEGIN CONVERSATION>

{conversation}

<END CONVERSATION>

Provide your safety assessment for ONLY THE LAST {role} message in the above conversation:
 - First line must read 'safe' or 'unsafe'.
 - If unsafe, a second line must include a comma-separated list of violated categories."""
VERDICT_MAX_TOKENS = 20  # "unsafe" and a few categories
CHECK_NAME = "guard_model"
_SPEAKERS = {"user": "User", "assistant": "Agent"}
_CATEGORY = re.compile(r"\b[SO][0-9]{1,2}\b")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = (p if isinstance(p, str) else p.get("text") for p in content if isinstance(p, str | dict))
        return "\n".join(p for p in parts if isinstance(p, str))
    return ""


def _turns(messages: Sequence[Mapping[str, Any]], answer: str | None) -> list[tuple[str, str]]:
    """(speaker, text) of the user and assistant turns (system and tool messages are not judged);
    consecutive turns of one speaker are joined, as the template alternates them."""
    turns: list[tuple[str, str]] = []
    said = [(_SPEAKERS[m["role"]], _text(m.get("content"))) for m in messages if m.get("role") in _SPEAKERS]
    for speaker, text in [*said, *([("Agent", answer)] if answer is not None else [])]:
        if turns and turns[-1][0] == speaker:
            turns[-1] = (speaker, f"{turns[-1][1]}\n\n{text}")
        else:
            turns.append((speaker, text))
    return turns


def _quoted(text: str) -> str:
    """Conversation text inside the template, unable to close the template's sections."""
    return text.replace("<BEGIN", "< BEGIN").replace("<END", "< END")


def guard_body(
    guard: GuardModelSpec, messages: Sequence[Mapping[str, Any]], answer: str | None = None
) -> dict[str, Any]:
    """The chat completion body for the guard model: judging the last user message (`answer` None) or
    the answer. Not streamed, no sampling (temperature 0), a short `max_tokens`."""
    role = "User" if answer is None else "Agent"
    turns = _turns(messages, answer)
    if guard.template == "llama_guard":
        chat = [{"role": "user" if s == "User" else "assistant", "content": t} for s, t in turns]
    else:
        prompt = INSTRUCT_TEMPLATE.format(
            role=role,
            categories="\n".join(f"{code}: {name}." for code, name in CATEGORIES),
            conversation="\n\n".join(f"{speaker}: {_quoted(text)}" for speaker, text in turns),
        )
        chat = [{"role": "user", "content": prompt}]
    return {
        "model": guard.model,
        "messages": chat,
        "max_tokens": VERDICT_MAX_TOKENS,
        "temperature": 0,
        "stream": False,
    }


@dataclass(frozen=True)
class GuardVerdict:
    safe: bool | None  # None: the model answered neither "safe" nor "unsafe"
    categories: tuple[str, ...] = ()


def parse_verdict(text: str) -> GuardVerdict:
    """Llama Guard's answer: the first non-empty line is `safe` or `unsafe` (any case, a trailing period
    allowed); after `unsafe`, the categories (`S1`, `S10`, ...) of the next line, or of the same line."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return GuardVerdict(None)
    first, _, rest = lines[0].partition(" ")
    word = first.lower().rstrip(".,:")
    if word == "safe" and not rest:
        return GuardVerdict(True)
    if word != "unsafe":
        return GuardVerdict(None)
    listed = rest if rest else (lines[1] if len(lines) > 1 else "")
    return GuardVerdict(False, tuple(c.upper() for c in _CATEGORY.findall(listed.upper())))


def guard_decision(
    guard: GuardModelSpec, verdict: GuardVerdict, direction: Direction, field: str
) -> Decision | None:
    """What the verdict does under the policy: None (safe), or the guard's action (`block` or `flag`)
    for an unsafe verdict, and for an unreadable one when `fail_closed`."""
    if verdict.safe or (verdict.safe is None and not guard.fail_closed):
        return None
    return Decision(direction, CHECK_NAME, guard.action, field)
