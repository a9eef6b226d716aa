"""The guard model's call (docs/guardrails.md): a team whose policy names a `guard_model` with `input: true`
has each chat or completion request's conversation checked by that chat model of the stack before the
request itself is admitted.

The check is one non-streaming chat completion (`apps.core.guardrails.guard_model.guard_body`:
temperature 0, at most 20 tokens) through the fleet like any other request: reserved in the team's
ledger under `<request id>:guard` at the guard model's prices and settled by the orchestrator with the
tokens that ran, so the team pays for its own checks. It takes none of the key's quotas (no stream slot,
no request per minute): it is the platform's check, not the client's request. Its verdict
(`parse_verdict`): `safe` passes; `unsafe` is the policy's action (`block`: 400 `guardrail_blocked` with
`param: messages`, nothing of the request reserved; `flag`: counted); an unreadable answer counts as
unsafe when `fail_closed` (the default), else passes. A guard that cannot be reached or fails is a 503
`guard_unavailable` when `fail_closed`, else the request goes on unchecked (counted as `flag`).
Never logged: the conversation, the prompt built from it, the answer.
"""

from __future__ import annotations

import asyncio
from typing import Any

from apps.core.errors import Unavailable, UpstreamFailed
from apps.core.guardrails.decisions import Decision
from apps.core.guardrails.guard_model import CHECK_NAME, guard_body, guard_decision, parse_verdict
from apps.core.guardrails.policy import GuardModelSpec
from apps.core.identity.principal import Principal
from apps.core.protocol.dispatch import Deadlines
from apps.gateway.collect import Timeouts, read_completion
from apps.gateway.deps import GatewayDeps
from apps.gateway.exchange import NOTHING_RAN, Exchange, dispatch_request
from apps.gateway.ports import DispatchUnavailable
from apps.gateway.relay import RelayOutcome
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
        self._s = settings
        self._d = deps

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
        assert principal.team_id is not None
        req = validate_chat(body, self._d.spec)
        call = Exchange(ex.request_id + GUARD_SUFFIX, ex.started)
        await self._d.ledger.reserve(  # a 402 here is the request's answer: the team cannot pay
            request_id=call.request_id,
            team_id=principal.team_id,
            key_id=principal.key_id,
            model=req.model,
            estimated_prompt_tokens=req.estimated_prompt_tokens,
            max_tokens=req.worst_case_completion_tokens,
        )
        deadlines = Deadlines(
            queue_wait_s=self._s.queue_wait_s, first_token_s=self._s.first_token_s, idle_s=self._s.idle_s
        )
        dreq = dispatch_request(req, principal, principal.team_id, call, deadlines)
        try:
            async with asyncio.timeout(self._s.queue_wait_s + self._s.first_token_s):
                upstream = await self._d.dispatcher.open(dreq)
        except DispatchUnavailable:
            await self._d.ledger.cancel(call.request_id)
            return None
        except TimeoutError:
            return None  # the orchestrator may have started it: it settles the row
        try:
            if upstream.status != 200:
                if upstream.status in NOTHING_RAN:
                    await self._d.ledger.cancel(call.request_id)
                return None
            timeouts = Timeouts(self._s.first_token_s, self._s.idle_s, self._s.max_request_s)
            answer = await read_completion(upstream, RelayOutcome(), timeouts, "chat")
        except UpstreamFailed:
            return None
        finally:
            await upstream.aclose()  # the orchestrator settles what ran
        try:
            text = answer["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            return None
        return text if isinstance(text, str) else ""
