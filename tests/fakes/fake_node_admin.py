"""In-memory `NodeAdmin` for the gateway's node admin routes."""

from __future__ import annotations

from collections.abc import Sequence


class FakeNodeAdmin:
    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, object]] = {}

    async def issue_token(
        self, node_id: str, location: str, *, pool: bool = False, models: Sequence[str] | None = None
    ) -> str:
        kind = "pool" if pool else "node"
        self.nodes[node_id] = {
            "node_id": node_id,
            "location": location,
            "kind": kind,
            "models": list(models or ()),
            "state": "stale",
        }
        return f"nt-{node_id}-secret"

    async def revoke(self, node_id: str) -> bool:
        return self.nodes.pop(node_id, None) is not None

    async def list_nodes(self) -> list[dict[str, object]]:
        return list(self.nodes.values())

    async def request_drain(self, node_id: str) -> bool:
        node = self.nodes.get(node_id)
        if node is None or node.get("state") != "ready":
            return False
        node["state"] = "draining"
        return True
