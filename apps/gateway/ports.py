"""The gateway's dependencies as Protocols (fakes live in `tests/fakes`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Protocol

from apps.core.protocol.dispatch import DispatchRequest


class Upstream(Protocol):
    """One dispatched request: status and headers known, body streaming."""

    status: int
    headers: Mapping[str, str]

    def chunks(self) -> AsyncIterator[bytes]: ...

    async def read_body(self) -> bytes: ...

    async def aclose(self) -> None:
        """Close the connection; the orchestrator then cancels the request on the node."""
        ...


class DispatchUnavailable(Exception):
    """No orchestrator replica could be reached: nothing ran."""


class Dispatcher(Protocol):
    async def open(self, request: DispatchRequest) -> Upstream:
        """Returns once the orchestrator answered with a status; raises `DispatchUnavailable`."""
        ...

    async def aclose(self) -> None: ...


class NodeAdmin(Protocol):
    async def issue_token(
        self, node_id: str, location: str, *, pool: bool = False, models: Sequence[str] | None = None
    ) -> str: ...

    async def revoke(self, node_id: str) -> bool: ...

    async def list_nodes(self) -> list[dict[str, object]]: ...

    async def request_drain(self, node_id: str) -> bool:
        """Ask the orchestrator owning the node's socket to drain it; False if none owns it."""
        ...


class Resolver(Protocol):
    async def resolve(self, host: str) -> list[str]:
        """IP addresses of a hostname; raises OSError when it does not resolve."""
        ...


class Health(Protocol):
    async def postgres_ok(self) -> bool: ...

    async def redis_ok(self) -> bool: ...
