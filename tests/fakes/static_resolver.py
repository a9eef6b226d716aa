"""A DNS table for the gateway's SSRF checks (`apps.gateway.ports.Resolver`): no network in tests."""

from __future__ import annotations


class StaticResolver:
    def __init__(self, table: dict[str, list[str]] | None = None) -> None:
        self.table = table or {}

    async def resolve(self, host: str) -> list[str]:
        if host not in self.table:
            raise OSError(f"cannot resolve {host}")
        return self.table[host]
