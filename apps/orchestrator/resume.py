"""Resuming a stream on another node when its node is lost after output started (docs/control-plane.md, "Resume").

The relay keeps the SSE events it wrote to the gateway (one list append per write, only for a
request that could be resumed). When the node fails mid-answer (engine error event, lost socket,
missed heartbeats, silence past the idle deadline, drain that cannot finish), `Resumer` parses
them once: the text delivered, the content tokens delivered (vLLM sends one content event per
token; the role chunk carries none), the stream's `id` and `created`. It asks another node of the
model to continue that text: the original request with the budget's remainder (`Budget.after` the
tokens delivered) and the text as data (`continuation`; the agent builds the engine's body,
apps/core/protocol/engine.py) and splices the new node's events into the same client stream: its role chunk is
dropped, `id` and `created` are the original ones, and its usage chunk is rewritten to what the
team is billed for.

Billing (`billed`, mirrored by the settle script in `settle.py`): the team pays its own prompt
once (the first node's count when it reported one, else the second node's prompt minus the
delivered tokens) and every completion token it received; the second node's prompt (the re-prefill
of the prompt and the delivered text) is platform cost, recorded on the ledger row
(`resume_prompt_tokens`) and in `llmfleet_orchestrator_resume_prefill_tokens_total`.

At most one resume per request; chat streams only; never with `n > 1`, logprobs or tools.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from apps.core.aio import shielded
from apps.core.budget import Budget
from apps.core.error_table import NODE_DRAINING
from apps.core.errors import LlmfleetError
from apps.core.nodes import keys
from apps.core.nodes.state import ROUTABLE
from apps.core.protocol.dispatch import DispatchRequest
from apps.core.protocol.node import Error
from apps.core.protocol.openai import SSE_DONE, sse_event
from apps.core.scheduling.canary import same_revision
from apps.orchestrator.plane import RelayParts
from apps.orchestrator.queue import DEFAULT_SHARE, Share
from apps.orchestrator.routing import assignment
from apps.orchestrator.scheduling.view import NodeView, PickRequest
from apps.orchestrator.streams import ChunkEv, DoneEv, ErrorEv, LostEv, RequestStream

_CLEANUP_S = 5.0
ASSIGN_ATTEMPTS = 3  # nodes tried for the continuation (one unreachable node is not the end)
_NO_RESUME_FIELDS = ("logprobs", "top_logprobs", "tools", "functions", "prompt_logprobs")


class Reason(enum.StrEnum):
    """Why the first node's stream ended (a bounded label)."""

    ENGINE_ERROR = "engine_error"  # vLLM's in-stream error event, or the engine connection dropped
    NODE_LOST = "node_lost"  # the node's socket closed, its heartbeats stopped, its owner vanished
    IDLE_TIMEOUT = "idle_timeout"  # connected but silent past the idle deadline
    DRAIN = "drain"  # a drain (spot interruption) that the stream would not outlive


class Outcome(enum.StrEnum):
    COMPLETED = "completed"  # the client's stream finished on the second node
    NOT_POSSIBLE = "not_possible"  # nothing to continue (answer finished, no tokens left)
    NO_NODE = "no_node"  # no other node with capacity within the first-token deadline
    FAILED = "failed"  # the second node failed too: the client gets the error event


def resumable(body: Mapping[str, Any], endpoint: str = "chat") -> bool:
    """A chat request, or a completion of one prompt string without `echo` or `suffix` (the engine
    always streams both), with one choice, no logprobs and no tools; never an embedding request."""
    if endpoint == "chat":
        if not isinstance(body.get("messages"), list):
            return False
    elif (
        endpoint != "completions"
        or not isinstance(body.get("prompt"), str)
        or body.get("echo")
        or body.get("suffix")
    ):
        return False
    if body.get("n") not in (None, 1):
        return False
    return not any(body.get(name) for name in _NO_RESUME_FIELDS)


def can_resume(dreq: DispatchRequest, models: Collection[str] | None) -> bool:
    """Resume is on for the model (`serving.resume_streams` in the stack) and the request allows it."""
    return (
        (models is None or dreq.model in models)
        and dreq.budget.n == 1
        and resumable(dreq.body, dreq.endpoint)
    )


@dataclass(frozen=True)
class Delivered:
    text: str  # the assistant text (a completion's text) the client has
    tokens: int  # content events the client has (= completion tokens, one event per token)
    chunk_id: str | None  # the stream's `id` and `created`, kept across the seam
    created: int | None
    finished: bool  # a `finish_reason` was delivered: there is nothing to continue


def _payloads(data: str) -> list[str]:
    return [e[6:] for e in data.split("\n\n") if e.startswith("data: ")]


def delivered(sent: list[str]) -> Delivered:
    """Parse what the relay wrote (once, at the resume)."""
    text: list[str] = []
    tokens = 0
    chunk_id: str | None = None
    created: int | None = None
    finished = False
    for payload in _payloads("".join(sent)):
        if payload == "[DONE]":
            continue
        obj = json.loads(payload)
        if not isinstance(obj, dict) or "choices" not in obj:
            continue
        if chunk_id is None:
            chunk_id, created = obj.get("id"), obj.get("created")
        for choice in obj["choices"]:
            delta = choice.get("delta") or {}
            if choice.get("finish_reason"):
                finished = True
            if "role" in delta and not delta.get("content"):
                continue  # the role chunk: no token
            tokens += 1
            text.append(delta.get("content") or choice.get("text") or "")  # chat or completions
    return Delivered("".join(text), tokens, chunk_id, created, finished)


@dataclass(frozen=True)
class Continuation:
    budget: Budget  # what the second node may still generate
    text: str | None  # the assistant text it continues (None: only the role chunk went out)


def continuation(budget: Budget, done: Delivered) -> Continuation | None:
    """The second node's part; None when nothing is left to generate."""
    if done.finished:
        return None
    rest = budget.after(done.tokens)
    if rest is None:
        return None
    return Continuation(rest, done.text if done.tokens else None)


def billed(
    second_prompt: int, second_completion: int, delivered_tokens: int, first_prompt: int | None
) -> tuple[int, int, int]:
    """(prompt, completion) the team pays and the prompt tokens that are platform cost."""
    prompt = first_prompt if first_prompt is not None else max(0, second_prompt - delivered_tokens)
    return prompt, delivered_tokens + second_completion, second_prompt


class Splice:
    """Rewrites the second node's events so they continue the client's stream."""

    def __init__(self, done: Delivered, first_prompt: int | None) -> None:
        self.done = done
        self.first_prompt = first_prompt
        self._role_dropped = False

    def _fix(self, obj: dict[str, Any]) -> None:
        if self.done.chunk_id is not None:
            obj["id"] = self.done.chunk_id
        if self.done.created is not None:
            obj["created"] = self.done.created

    def chunks(self, data: str) -> bytes:
        out: list[bytes] = []
        for payload in _payloads(data):
            obj = json.loads(payload)
            if not isinstance(obj, dict):
                continue
            choices = obj.get("choices") or []
            if not self._role_dropped and choices:
                delta = choices[0].get("delta") or {}
                if "role" in delta and not delta.get("content"):
                    self._role_dropped = True
                    continue
            self._fix(obj)
            out.append(sse_event(json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()))
        return b"".join(out)

    def usage_event(self, raw: str, second_prompt: int, second_completion: int) -> bytes:
        obj = json.loads(raw)
        prompt, completion, _ = billed(second_prompt, second_completion, self.done.tokens, self.first_prompt)
        usage = dict(obj.get("usage") or {})
        usage.update(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
        obj["usage"] = usage
        self._fix(obj)
        return sse_event(json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode())


Write = Callable[[bytes], Awaitable[None]]


class Resumer:
    """One resume of one request: pick another node, assign the continuation, relay it spliced."""

    def __init__(
        self,
        parts: RelayParts,
        dreq: DispatchRequest,
        write: Write,
        retry_hint: Callable[[], float],
        share: Share = DEFAULT_SHARE,
    ) -> None:
        self.parts = parts
        self.dreq = dreq
        self.share = share  # the fair queue charges the resume to the request's own team
        self.write = write
        self.retry_hint = retry_hint
        self.assigned = False  # the second node got the assignment (it settles the request now)
        self.node_id = ""
        self.end: ErrorEv | LostEv | None = None  # how the second node's stream ended, if it failed

    async def run(self, sent: list[str], lost: NodeView, reason: Reason, error: Error | None) -> Outcome:
        outcome = await self._run(sent, lost, error)
        self.parts.metrics.resumes.labels(
            model=self.dreq.model, reason=reason.value, outcome=outcome.value
        ).inc()
        return outcome

    async def _run(self, sent: list[str], lost: NodeView, error: Error | None) -> Outcome:
        parts, dreq = self.parts, self.dreq
        done = delivered(sent)
        cont = continuation(dreq.budget, done)
        if cont is None:
            return Outcome.NOT_POSSIBLE
        first_prompt = error.prompt_tokens if error is not None and error.prompt_tokens > 0 else None
        revision = same_revision(lost.revisions.get(dreq.model))
        others = [
            n
            for n in parts.fleet.snapshot()
            if n.node_id != lost.node_id
            and dreq.model in n.models
            and n.state in ROUTABLE
            and (revision is None or n.revisions.get(dreq.model) in revision)
        ]
        if not others:
            return Outcome.NO_NODE  # nobody to wait for: fail now, not at the deadline
        # The client has been waiting since its last chunk: within its idle deadline too.
        wait = min(dreq.deadlines.first_token_s, dreq.deadlines.idle_s)
        started = await self._assign(cont, lost, first_prompt, done, parts.monotonic() + wait)
        if started is None:
            return Outcome.NO_NODE
        node, stream = started
        splice = Splice(done, first_prompt)
        try:
            self.assigned = True
            return await self._relay(node, stream, splice)
        except BaseException:
            # The gateway went away (or the write failed): stop the second node; its done settles.
            if self.assigned:
                await shielded(parts.routing.cancel(node.node_id, dreq.request_id), _CLEANUP_S, "cancel")
            raise
        finally:
            stream.close()
            await shielded(parts.routing.finish(node.node_id, dreq.request_id, stream), _CLEANUP_S, "finish")

    async def _assign(
        self,
        cont: Continuation,
        lost: NodeView,
        first_prompt: int | None,
        done: Delivered,
        deadline: float,
    ) -> tuple[NodeView, RequestStream] | None:
        """The continuation on another node, within `deadline`. A node the assignment cannot reach
        (its owner replica died and this replica's fleet view does not know it yet: nobody hears
        its channel) is left out and the next one tried, up to `ASSIGN_ATTEMPTS` nodes."""
        parts, dreq = self.parts, self.dreq
        excluded = {lost.node_id}
        for _ in range(ASSIGN_ATTEMPTS):
            pick = PickRequest(
                dreq.model,
                dreq.request_id,
                frozenset(excluded),
                parts.settings.kv_cache_max,
                budget=dreq.budget,  # the settle caps the whole request at its own budget
                revisions=same_revision(lost.revisions.get(dreq.model)),  # never another model version
            )
            try:
                left = max(deadline - parts.monotonic(), 0.0)
                node = await parts.queues.acquire(pick, left, self.retry_hint, self.share, continuation=True)
            except LlmfleetError:
                return None
            self.node_id = node.node_id
            # Before the assignment leaves: the second node's done/error settles through this.
            await parts.redis.hset(
                keys.request_key(dreq.request_id),
                mapping={
                    "resume_delivered": done.tokens,
                    "resume_prompt": "" if first_prompt is None else first_prompt,
                },
            )
            stream = RequestStream(dreq.request_id, node.node_id, parts.settings.relay_queue_events)
            sent = False
            try:
                sent = await parts.routing.start(node, assignment(dreq, cont.budget, cont.text), stream)
            finally:
                if not sent:
                    stream.close()
                    await shielded(
                        parts.routing.finish(node.node_id, dreq.request_id, stream), _CLEANUP_S, "finish"
                    )
            if sent:
                return node, stream
            excluded.add(node.node_id)
        return None

    async def _relay(self, node: NodeView, stream: RequestStream, splice: Splice) -> Outcome:
        """The second node's stream, spliced onto what the client already has, to its end."""
        parts, dreq = self.parts, self.dreq
        wait = dreq.deadlines.first_token_s
        while True:
            ev = await stream.next(wait)
            wait = dreq.deadlines.idle_s
            if isinstance(ev, ChunkEv):
                data = splice.chunks(ev.delta + "".join(stream.take_chunks()))
                if data:
                    await self.write(data)
                continue
            if isinstance(ev, DoneEv):
                frame = ev.frame
                parts.metrics.resume_prefill_tokens.labels(model=dreq.model).inc(frame.prompt_tokens)
                if dreq.client_wants_usage and frame.usage_event:
                    usage = splice.usage_event(
                        frame.usage_event, frame.prompt_tokens, frame.completion_tokens
                    )
                    await self.write(usage + SSE_DONE)
                else:
                    await self.write(SSE_DONE)
                return Outcome.COMPLETED
            if ev is None or (isinstance(ev, LostEv) and ev.reason.value == "relay_overflow"):
                await shielded(parts.routing.cancel(node.node_id, dreq.request_id), _CLEANUP_S, "cancel")
            self.end = ev
            return Outcome.FAILED


def resume_reason(ev: ErrorEv | LostEv | None) -> Reason | None:
    """The resume reason of a mid-stream end, None when it is not the node's failure."""
    if ev is None:
        return Reason.IDLE_TIMEOUT
    if isinstance(ev, ErrorEv):
        if ev.frame.error_type == NODE_DRAINING.node_type:
            return Reason.DRAIN  # the node's drain budget ran out (a spot reclaim): hand it over
        return Reason.ENGINE_ERROR if ev.frame.status >= 500 else None
    if ev.reason.value in ("relay_overflow", "shutdown"):
        return None  # the gateway is too slow / this replica is stopping: not the node's failure
    return Reason.NODE_LOST
