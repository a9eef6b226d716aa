"""A fake capacity source for the orchestrator's queues: `free` slots; records who got one, in order."""

from __future__ import annotations

from apps.core.nodes.state import NodeState
from apps.orchestrator.scheduling.view import NodeView, PickRequest

NODE = NodeView(node_id="n1", location="cloud", models={"m": 1}, state=NodeState.READY)


class Slots:
    def __init__(self, free: int = 0) -> None:
        self.free = free
        self.served: list[str] = []

    async def try_pick(self, req: PickRequest) -> NodeView | None:
        if self.free <= 0:
            return None
        self.free -= 1
        self.served.append(req.request_id)
        return NODE
