"""The real `Dispatcher`: `POST /internal/v1/dispatch` on an orchestrator replica over pooled
keep-alive connections (`apps.netio.http_client`; contract: `apps.core.protocol.dispatch`).

Several replicas: requests rotate over them; a replica that refuses the connection is
skipped and the next one tried, and so is a stopping replica that refuses the dispatch (503 with
`x-llmfleet-retry-elsewhere`: nothing ran there), so a rolling restart costs no request. Once a replica
answered, the request is never sent elsewhere (it may already run on a node).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence

from apps.core.protocol.dispatch import DISPATCH_PATH, RETRY_ELSEWHERE, DispatchRequest, bearer
from apps.gateway.ports import DispatchUnavailable
from apps.netio.http_client import HostPool, HttpResponse, Unreachable

# The `Upstream` of this dispatcher: `aclose()` before the body is complete drops the TCP
# connection, so the orchestrator sees the disconnect and cancels the request on the node.
HttpUpstream = HttpResponse


MAX_REFUSALS = 3  # one URL: fresh connections tried after a stopping replica's refusal


class HttpDispatcher:
    def __init__(self, urls: Sequence[str], internal_token: str, *, limit: int = 2000) -> None:
        if not urls:
            raise ValueError("at least one orchestrator URL is required")
        slots = asyncio.Semaphore(limit)  # one limit over all replicas, as aiohttp's connector had
        self._pools = [HostPool(url, limit=limit, slots=slots) for url in urls]
        headers = {"Authorization": bearer(internal_token), "Content-Type": "application/json"}
        # The head is the same for every request to a replica: encoded once, only the length varies.
        self._heads = [pool.head("POST", pool.base_path + DISPATCH_PATH, headers) for pool in self._pools]
        self._next = itertools.cycle(range(len(self._pools)))

    async def open(self, request: DispatchRequest) -> HttpUpstream:
        payload = request.model_dump_json().encode()
        count = len(self._pools)
        start = next(self._next)
        last: Exception | None = None
        i = refusals = 0
        while i < count:
            index = (start + i) % count
            pool = self._pools[index]
            try:
                response = await pool.send(self._heads[index], payload)
            except Unreachable as exc:
                last = exc
                i += 1
                continue
            if response.status == 503 and response.headers.get(RETRY_ELSEWHERE):
                # A stopping replica (apps/orchestrator/handover.py): nothing ran there. Its other
                # kept-alive connections lead there too: dropped. One URL (a Kubernetes Service):
                # again on a fresh connection, which lands on a ready replica; else the next URL.
                await response.aclose()
                pool.drop_idle()
                last = DispatchUnavailable("the orchestrator replica is stopping")
                refusals += 1
                if count > 1 or refusals > MAX_REFUSALS:
                    i += 1
                continue
            return response
        raise DispatchUnavailable(f"no orchestrator reachable: {last}")

    async def aclose(self) -> None:
        for pool in self._pools:
            await pool.aclose()
