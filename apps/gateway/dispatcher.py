"""The real `Dispatcher`: `POST /internal/v1/dispatch` on an orchestrator replica over one
pooled aiohttp session (contract: `apps.core.protocol.dispatch`).

Several replicas: requests rotate over them; a replica that refuses the connection is
skipped and the next one tried, so a rolling restart costs no request. Once a replica
answered, the request is never sent elsewhere (it may already run on a node).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Mapping, Sequence

import aiohttp

from apps.core.protocol.dispatch import DISPATCH_PATH, DispatchRequest
from apps.gateway.ports import DispatchUnavailable


class _Chunks:
    """Reads as they arrive: one coroutine per chunk, no async-generator and `iter_any` layers
    (this is on the relay's per-chunk path)."""

    def __init__(self, content: aiohttp.StreamReader) -> None:
        self._content = content

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> bytes:
        try:
            data = await self._content.readany()
        except aiohttp.ClientError as exc:
            raise ConnectionError(str(exc)) from exc
        if not data:
            raise StopAsyncIteration
        return data


class HttpUpstream:
    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status
        self.headers: Mapping[str, str] = {k.lower(): v for k, v in response.headers.items()}

    def chunks(self) -> AsyncIterator[bytes]:
        return _Chunks(self._response.content)

    async def read_body(self) -> bytes:
        try:
            return await self._response.read()
        except aiohttp.ClientError as exc:
            raise ConnectionError(str(exc)) from exc

    async def aclose(self) -> None:
        # Closing (not releasing) drops the connection if the body is unread: the orchestrator sees
        # the disconnect and cancels the request on the node.
        self._response.close()


class HttpDispatcher:
    def __init__(self, urls: Sequence[str], internal_token: str, *, limit: int = 2000) -> None:
        if not urls:
            raise ValueError("at least one orchestrator URL is required")
        self._urls = [u.rstrip("/") for u in urls]
        self._next = itertools.cycle(range(len(self._urls)))
        self._token = internal_token
        self._limit = limit
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._limit, limit_per_host=self._limit),
                timeout=aiohttp.ClientTimeout(total=None, connect=5),
                auto_decompress=False,
            )
        return self._session

    async def open(self, request: DispatchRequest) -> HttpUpstream:
        session = self._get_session()
        payload = request.model_dump_json().encode()
        headers = {"Authorization": f"Bearer {self._token}", "Content-Type": "application/json"}
        start = next(self._next)
        last: Exception | None = None
        for i in range(len(self._urls)):
            url = self._urls[(start + i) % len(self._urls)] + DISPATCH_PATH
            try:
                response = await session.post(url, data=payload, headers=headers)
            except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as exc:
                last = exc
                continue
            return HttpUpstream(response)
        raise DispatchUnavailable(f"no orchestrator reachable: {last}")

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
