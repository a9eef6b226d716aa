"""The guard model's call (docs/guardrails.md): a team whose policy names a `guard_model` with `input: true`
has each chat or completion request's conversation checked by that chat model of the stack before the
request itself is admitted.

The check is one non-streaming chat completion (`apps.core.guardrails.guard_model.guard_body`:
temperature 0, at most 20 tokens) through the fleet (`apps.gateway.fleet_call`: billed to the team under
`<request id>:guard`, none of the key's quotas). Its verdict
(`parse_verdict`): `safe` passes; `unsafe` is the policy's action (`block`: 400 `guardrail_blocked` with
`param: messages`, nothing of the request reserved; `flag`: counted); an unreadable answer counts as
unsafe when `fail_closed` (the default), else passes. A guard that cannot be reached or fails is a 503
`guard_unavailable` when `fail_closed`, else the request goes on unchecked (counted as `flag`).
Never logged: the conversation, the prompt built from it, the answer.
"""

from __future__ import annotations

from typing import Any

from apps.core.errors import Unavailable
from apps.core.guardrails.decisions import Decision
from apps.core.guardrails.guard_model import CHECK_NAME, guard_body, guard_decision, parse_verdict
from apps.core.guardrails.policy import GuardModelSpec
from apps.core.identity.principal import Principal
from apps.gateway.deps import GatewayDeps
from apps.gateway.exchange import Exchange
from apps.gateway.fleet_call import FleetCall
from apps.gateway.settings import GatewaySettings
from apps.gateway.validate import validate_chat

GUARD_SUFFIX = ":guard"  # the guard call's ledger row: the request's id and this


def conversation(endpoint: str, body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The messages the guard judges: a chat's own, a completion's prompt as one user message; None
    for what it cannot judge (embeddings, a token id prompt)."""
    if endpoint == "chat":
        messages = body.get("messages")
        return messages if isinstance(messages, list) else None
    prompt = body.get("prompt")
    if endpoint == "completions" and isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return None


class GuardCall:
    def __init__(self, settings: GatewaySettings, deps: GatewayDeps) -> None:
        self._d = deps
        self._call = FleetCall(settings, deps)

    async def check_input(
        self, guard: GuardModelSpec, endpoint: str, body: dict[str, Any], principal: Principal, ex: Exchange
    ) -> Decision | None:
        """The guard's decision on the request (None: safe, or nothing to judge)."""
        messages = conversation(endpoint, body)
        if messages is None or not guard.input:
            return None
        verdict = await self._ask(guard, guard_body(guard, messages), principal, ex)
        if verdict is None:  # no answer from the guard
            if guard.fail_closed:
                raise Unavailable(
                    "The guard model of the team's guardrail policy did not answer.",
                    code="guard_unavailable",
                    retry_after=5,
                )
            return Decision("input", CHECK_NAME, "flag", "messages")
        return guard_decision(guard, parse_verdict(verdict), "input", "messages")

    async def _ask(
        self, guard: GuardModelSpec, body: dict[str, Any], principal: Principal, ex: Exchange
    ) -> str | None:
        """The guard's answer text, or None when it could not be had."""
        answer = await self._call.run(validate_chat(body, self._d.spec), principal, ex, GUARD_SUFFIX)
        if answer is None:
            return None
        try:
            text = answer["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            return None
        return text if isinstance(text, str) else ""
