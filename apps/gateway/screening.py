"""A team's guardrail policy on one request (docs/guardrails.md): the input checks on the body before
anything is admitted or reserved, and the output checks on the answer as it streams.

Input (`Screening.screen_input`): a `block` match is a 400 `guardrail_blocked` that takes nothing (no
slot, no reservation, no money); `redact` sends the redacted copy upstream; `flag` only counts.

Output (`Screening.screen_output`): the upstream is wrapped in a `ScreenedUpstream`, which parses each
SSE event (only for a team whose policy has output checks: every other stream keeps the byte-for-byte
relay and its fast paths, which this wrapper does not offer) and passes each choice's text through its
own `OutputScanner`. A scanner holds back only the trailing characters that could still become part
of a match (at most 128, usually the last word or digit run), so a redaction works across any chunk
boundary; a choice's held text goes out with its `finish_reason` chunk, or in one chunk before
`[DONE]`. A `block` ends the stream with the `guardrail_blocked` error event and `[DONE]`; the gateway
then closes the upstream, so the orchestrator cancels the request on its node and settles only the
tokens that ran. Embedding answers carry no text to scan. Every decision is counted at once in
`llmfleet_gateway_guardrail_decisions_total` and kept in the request's `Exchange` until its end, when
`apps.gateway.decision_counts` counts them for the console; matched text is never logged or stored.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import psycopg

from apps.core.error_table import GUARDRAIL_BLOCKED, stream_error
from apps.core.errors import StoreUnavailable, Unavailable
from apps.core.guardrails.api import GuardrailPolicies
from apps.core.guardrails.bodies import scan_input
from apps.core.guardrails.decisions import Decision, GuardrailBlocked
from apps.core.guardrails.metrics import GuardrailMetrics
from apps.core.guardrails.policy import Check, CompiledPolicy
from apps.core.guardrails.stream import OutputScanner
from apps.core.identity.principal import Principal
from apps.core.protocol.openai import DONE_PAYLOAD, SSE_DONE, SseSplitter, sse_event
from apps.gateway.exchange import Exchange
from apps.gateway.guard import GuardCall
from apps.gateway.ports import Upstream, WrappedUpstream

Count = Callable[[Iterable[Decision]], None]


class ScreenedUpstream(WrappedUpstream):
    """An upstream whose answer text passes the policy's output checks (see the module doc)."""

    def __init__(self, inner: Upstream, checks: tuple[Check, ...], endpoint: str, count: Count) -> None:
        super().__init__(inner)
        self._checks = checks
        self._text_key = "text" if endpoint == "completions" else "content"
        self._count = count
        self._scanners: dict[int, OutputScanner] = {}
        self._last: dict[str, Any] = {}  # the last chunk's id, object, created, model (for a flush)
        self.blocked: Decision | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        splitter = SseSplitter()
        async for data in self._inner.chunks():
            out: list[bytes] = []
            for payload in splitter.feed(data):
                if payload == DONE_PAYLOAD:
                    out.append(self._flush() + SSE_DONE)
                    continue
                screened = self._screen(payload)
                out.append(screened)
                if self.blocked is not None:
                    break
            if out:
                yield b"".join(out)
            if self.blocked is not None:
                return  # the upstream is left unread: the gateway closes it, the node stops

    def _scanner(self, index: int) -> OutputScanner:
        scanner = self._scanners.get(index)
        if scanner is None:
            scanner = self._scanners[index] = OutputScanner(self._checks, field=f"choices.{index}")
        return scanner

    def _screen(self, payload: bytes) -> bytes:
        try:
            chunk = json.loads(payload)
        except ValueError:
            return sse_event(payload)
        choices = chunk.get("choices") if isinstance(chunk, dict) else None
        if not choices:
            return sse_event(payload)  # the usage chunk, an error event: nothing to screen
        self._last = {k: chunk[k] for k in ("id", "object", "created", "model") if k in chunk}
        changed = False
        for choice in choices:
            holder = choice.get("delta") if self._text_key == "content" else choice
            if not isinstance(holder, dict):
                continue
            text = holder.get(self._text_key)
            scanner = self._scanner(int(choice.get("index", 0)))
            outcome = scanner.feed(text if isinstance(text, str) else "")
            released, decisions, blocked = outcome.text, list(outcome.decisions), outcome.blocked
            if blocked is None and choice.get("finish_reason") is not None:
                end = scanner.finish()
                released, blocked = released + end.text, end.blocked
                decisions.extend(end.decisions)
            self._count(decisions)
            if released != (text if isinstance(text, str) else ""):
                holder[self._text_key] = released
                changed = True
            if blocked is not None:
                self.blocked = blocked
                event = sse_event(_dump(chunk)) if released else b""
                return event + stream_error(
                    GUARDRAIL_BLOCKED, GuardrailBlocked(blocked).message, blocked.field
                )
        # Most deltas go out as they came (nothing held, nothing redacted): the engine's own bytes.
        return sse_event(_dump(chunk)) if changed else sse_event(payload)

    def _flush(self) -> bytes:
        """Text still held by a choice whose end was not seen: one chunk of it, before `[DONE]`."""
        out: list[bytes] = []
        for index, scanner in sorted(self._scanners.items()):
            if scanner.held == 0:
                continue
            end = scanner.finish()
            self._count(end.decisions)
            if end.blocked is not None:
                self.blocked = end.blocked
                message = GuardrailBlocked(end.blocked).message
                return (
                    b"".join(out)
                    + stream_error(GUARDRAIL_BLOCKED, message, end.blocked.field)[: -len(SSE_DONE)]
                )
            if end.text:
                out.append(sse_event(_dump(self._text_chunk(index, end.text))))
        return b"".join(out)

    def _text_chunk(self, index: int, text: str) -> dict[str, Any]:
        if self._text_key == "text":
            choice: dict[str, Any] = {"index": index, "text": text, "logprobs": None, "finish_reason": None}
        else:
            choice = {"index": index, "delta": {"content": text}, "logprobs": None, "finish_reason": None}
        return {**self._last, "choices": [choice]}


def _dump(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


class Screening:
    """The gateway's guardrails: its policies (None: no team has any), the decision metric and the
    guard model's call (None: a policy's `guard_model` is not enforced; tests only). Each decision is
    counted in the metric and added to the request's `Exchange.decisions` (counted for the console at
    the request's end: `apps.gateway.decision_counts`)."""

    def __init__(
        self, policies: GuardrailPolicies | None, metrics: GuardrailMetrics, guard: GuardCall | None = None
    ) -> None:
        self._policies = policies
        self._metrics = metrics
        self._guard = guard

    async def policy(self, team_id: int) -> CompiledPolicy | None:
        """The team's compiled policy (cached by the store); a 503 when it cannot be read (the
        checks are never skipped because their store is down)."""
        if self._policies is None:
            return None
        try:
            return await self._policies.compiled(team_id)
        except (psycopg.OperationalError, OSError, StoreUnavailable):
            raise Unavailable(
                "The guardrail policies are unavailable.", code="guardrails_unavailable", retry_after=5
            ) from None

    def counter(self, team_id: int, ex: Exchange) -> Count:
        """What counts a batch of the request's decisions: the metric now, the console at its end."""

        def count(decisions: Iterable[Decision]) -> None:
            batch = list(decisions)
            if batch:
                self._metrics.count(team_id, batch)
                ex.decisions.extend(batch)

        return count

    def screen_input(
        self, policy: CompiledPolicy | None, endpoint: str, body: dict[str, Any], team_id: int, ex: Exchange
    ) -> dict[str, Any]:
        """The body to send upstream (redacted where the policy says), or `GuardrailBlocked`."""
        if policy is None or not policy.input:
            return body
        scan = scan_input(policy.input, endpoint, body)  # type: ignore[arg-type]
        self.counter(team_id, ex)(scan.decisions)
        if scan.blocked is not None:
            raise GuardrailBlocked(scan.blocked)
        return scan.body

    async def guard_input(
        self,
        policy: CompiledPolicy | None,
        endpoint: str,
        body: dict[str, Any],
        principal: Principal,
        ex: Exchange,
    ) -> None:
        """The guard model's verdict on the request (`apps.gateway.guard`): counted; a block raises."""
        guard = policy.guard_model if policy is not None else None
        if guard is None or self._guard is None or principal.team_id is None:
            return
        decision = await self._guard.check_input(guard, endpoint, body, principal, ex)
        if decision is None:
            return
        self.counter(principal.team_id, ex)((decision,))
        if decision.action == "block":
            raise GuardrailBlocked(decision)

    def screen_output(
        self, upstream: Upstream, policy: CompiledPolicy | None, endpoint: str, team_id: int, ex: Exchange
    ) -> Upstream:
        if policy is None or not policy.output or endpoint == "embeddings":
            return upstream
        return ScreenedUpstream(upstream, tuple(policy.output), endpoint, self.counter(team_id, ex))
