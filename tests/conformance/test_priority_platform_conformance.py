"""The priority class reaches the engine's own scheduler through the platform (a real orchestrator
and a real agent in front of enginesim, and of the real vLLM in the `realvllm` stage).

The engine's batch is filled straight from the test with requests at priority 5, between the two
classes' values (interactive 0, batch 10: `apps.core.sharing.VLLM_PRIORITY`); the orchestrator
does not see them, so it dispatches as to an idle node. Then, in this order, a `batch` request
through the platform, one more priority-5 request straight to the engine, an `interactive` request
through the platform. Slots are freed one at a time by aborting a filling request:
- the first goes to the interactive request although it arrived last: its priority is below 5;
- the second goes to the priority-5 request although the batch one arrived before it: the batch
  priority is above 5. Had the class been dropped on the way, both would be vLLM's default 0 and
  the batch request (the earliest of them) would take the first slot.
Each admission is read from the engine's scheduler gauges (`tests/conformance/slots.py`).
"""

from __future__ import annotations

from collections.abc import Awaitable

import httpx

from apps.core.sharing import PriorityClass
from tests.conformance.agent_env import AgentFleet, fleet
from tests.conformance.conftest import MAX_NUM_SEQS
from tests.conformance.slots import HOLD_TOKENS, Held, Holder, conclusively, hold_body

__all__ = ["fleet"]  # the fixture, imported from agent_env
MID = 5


async def _through_platform(fleet: AgentFleet, held: Holder, cls: PriorityClass) -> Held:
    request_id = await fleet.reserve(HOLD_TOKENS)
    args = fleet.dispatch_args(request_id, fleet.body(HOLD_TOKENS), True, cls)

    def send(client: httpx.AsyncClient) -> Awaitable[httpx.Response]:
        req = client.build_request("POST", args["url"], content=args["data"], headers=args["headers"])
        return client.send(req, stream=True)

    return held.start(cls.value, send)


async def _free_one_slot(held: Holder, fill: Held, waiting: int) -> None:
    """Abort `fill`; return once exactly one waiting request was admitted (`waiting` left) and one
    more held request streams, with the engine still there (no second admission, nothing ended)."""
    streaming = sum(h.streaming for h in held.held)
    fill.release()
    await held.until_state(MAX_NUM_SEQS, waiting)
    await held.until(lambda: sum(h.streaming for h in held.held) > streaming, "an admission")
    end = await held.engine_state()  # Inconclusive if a request ended by itself
    assert (end.running, end.waiting) == (MAX_NUM_SEQS, waiting)


async def test_each_class_reaches_the_engine_scheduler_as_its_priority(fleet: AgentFleet) -> None:
    model, n = fleet.engine.model, MAX_NUM_SEQS

    async def check(held: Holder) -> None:
        fills = [held.chat(hold_body(model, f"fill{i}", MID), f"fill{i}") for i in range(n)]
        await held.until_state(n, 0)
        batch = await _through_platform(fleet, held, PriorityClass.BATCH)
        await held.until_state(n, 1)
        mid = held.chat(hold_body(model, "mid", MID), "mid")
        await held.until_state(n, 2)
        interactive = await _through_platform(fleet, held, PriorityClass.INTERACTIVE)
        await held.until_state(n, 3)
        await _free_one_slot(held, fills[0], waiting=2)
        assert interactive.streaming  # its priority is below 5: it came last and went first
        assert not mid.streaming
        assert not batch.streaming
        await _free_one_slot(held, fills[1], waiting=1)
        assert mid.streaming  # the batch priority is above 5: the priority-5 one came later, went first
        assert not batch.streaming

    await conclusively(fleet.engine.url, check)
