"""A request the platform itself makes through the fleet on behalf of a team's request: the guard model's
verdict (`apps.gateway.guard`) and the response cache's embedding of a question (`apps.gateway.caching`).

It runs like any other request (dispatched, queued fairly, relayed) and is reserved in the team's ledger
under `<request id><suffix>` at the called model's prices, settled by the orchestrator with the tokens that
ran, so the team pays for its own checks and lookups. It takes none of the key's quotas (no stream slot, no
request per minute): it is the platform's call, not the client's request. `FleetCall.run` gives the
assembled answer, or None when it could not be had (no orchestrator, a refusal, a timeout, a failed
stream); a 402 (the team cannot pay for it) is raised, as the request's own answer. Never logged: the
body, the answer.
"""

from __future__ import annotations

import asyncio
from typing import Any

from apps.core.errors import UpstreamFailed
from apps.core.identity.principal import Principal
from apps.core.protocol.dispatch import Deadlines
from apps.gateway.collect import Timeouts, read_completion
from apps.gateway.deps import GatewayDeps
from apps.gateway.exchange import NOTHING_RAN, Exchange, dispatch_request
from apps.gateway.ports import DispatchUnavailable
from apps.gateway.relay import RelayOutcome
from apps.gateway.settings import GatewaySettings
from apps.gateway.validate import InferenceRequest


class FleetCall:
    def __init__(self, settings: GatewaySettings, deps: GatewayDeps) -> None:
        self._s = settings
        self._d = deps

    async def run(
        self, req: InferenceRequest, principal: Principal, ex: Exchange, suffix: str
    ) -> dict[str, Any] | None:
        assert principal.team_id is not None
        call = Exchange(ex.request_id + suffix, ex.started)
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
            return await read_completion(upstream, RelayOutcome(), timeouts, req.endpoint)
        except UpstreamFailed:
            return None
        finally:
            await upstream.aclose()  # the orchestrator settles what ran
