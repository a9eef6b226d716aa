"""Priority classes through the real orchestrator (real Redis, a scripted node over a real
WebSocket): batch never fills the slots it leaves to interactive, waiting batch is served after
waiting interactive, and the class reaches the engine as vLLM's `priority`."""

from __future__ import annotations

import asyncio

from apps.core.protocol.engine import engine_body
from apps.core.sharing import VLLM_PRIORITY, PriorityClass
from tests.integration.orchestrator_env import Env, eventually


async def _true(value: bool) -> bool:
    return value


async def test_interactive_finds_a_slot_while_batch_fills_the_node(env: Env) -> None:
    orch = await env.orchestrator(batch_reserve_fraction=0.25)
    node = await env.node(orch, "n1")  # 4 sequences, and answers nothing until told
    batch = [
        asyncio.create_task(
            env.dispatch(orch, f"b{i}", priority_class="batch", deadlines={"queue_wait_s": 5})
        )
        for i in range(6)
    ]
    assigns = [await asyncio.wait_for(node.assigns.get(), 5) for _ in range(3)]
    # Three of four slots: the fourth is left to interactive; the other batch requests wait.
    await eventually(lambda: _true(orch.plane.queues.depth("m") == 3))
    assert node.assigns.empty()
    assert {engine_body(a)["priority"] for a in assigns} == {VLLM_PRIORITY[PriorityClass.BATCH]}
    interactive = asyncio.create_task(env.dispatch(orch, "i0"))
    assign = await asyncio.wait_for(node.assigns.get(), 5)
    assert assign.request_id == "i0"
    assert engine_body(assign)["priority"] == VLLM_PRIORITY[PriorityClass.INTERACTIVE]
    for task in (*batch, interactive):
        task.cancel()
    await asyncio.gather(*batch, interactive, return_exceptions=True)
