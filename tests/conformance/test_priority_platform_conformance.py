"""The priority class reaches the engine's own scheduler through the platform (a real orchestrator
and a real agent in front of enginesim, and of the real vLLM in the `realvllm` stage).

Queued in this order in the paused engine (`slots.py`), each confirmed by the engine's own
snapshot before the next is sent: six "fills" at priority 5 straight from the test, a `batch`
request through the platform, a priority-5 request ("mid") straight from the test, an
`interactive` request through the platform: nine requests for eight seats. The three share prompt
prefixes: interactive = A, mid = A + B, batch = A + B (then each its own word).

Released together, the scheduler seats by (priority, arrival): interactive (0) first, then the
fills and mid (5); batch (10) waits for a seat. So interactive computes A and finds nothing cached,
mid (seated in the same step, after it) finds A cached, batch (seated later) finds A + B cached:
0 = interactive < mid < batch. Had the class been dropped on the way, both would be vLLM's default
0 and batch, which came before interactive, would have been seated first and found nothing cached.
"""

from __future__ import annotations

from collections.abc import Awaitable

import httpx

from apps.core.scheduling.prefix import team_scope
from apps.core.sharing import PriorityClass
from tests.conformance.agent_env import AgentFleet, fleet
from tests.conformance.conftest import MAX_NUM_SEQS
from tests.conformance.slots import Outcome, PausedEngine, paused_engine, run_tag, words

__all__ = ["fleet"]  # the fixture, imported from agent_env
MID = 5
ANSWER = 16
PREFIX_WORDS = (
    50  # several KV blocks on both engines (see test_priority_conformance.py); A + B within 2,048 tokens
)


async def _through_platform(
    fleet: AgentFleet, eng: PausedEngine, cls: PriorityClass, content: str
) -> Outcome:
    request_id = await fleet.reserve(ANSWER)
    body = fleet.body(ANSWER, messages=[{"role": "user", "content": content}])
    args = fleet.dispatch_args(request_id, body, True, cls)

    def send(client: httpx.AsyncClient) -> Awaitable[httpx.Response]:
        req = client.build_request("POST", args["url"], content=args["data"], headers=args["headers"])
        return client.send(req, stream=True)

    outcome = eng.start(cls.value, send)
    await eng.queued(outcome)
    return outcome


async def test_each_class_reaches_the_engine_scheduler_as_its_priority(fleet: AgentFleet) -> None:
    engine = fleet.engine
    tag = run_tag()
    a, b = words(f"a{tag}x", PREFIX_WORDS), words(f"b{tag}x", PREFIX_WORDS)
    async with paused_engine(engine.url, engine.model) as eng:
        for i in range(MAX_NUM_SEQS - 2):
            await eng.queued(eng.chat(f"fill{i}", words(f"f{i}{tag}x", 4), MID, ANSWER))
        batch = await _through_platform(fleet, eng, PriorityClass.BATCH, f"{a} {b} batch")
        # Straight to the engine, with the salt the platform gives the fleet's team (teams never
        # share cached blocks): so it shares A and B with the two requests through the platform.
        mid = eng.chat("mid", f"{a} {b} mid", MID, ANSWER, cache_salt=team_scope(fleet.team_id))
        await eng.queued(mid)
        interactive = await _through_platform(fleet, eng, PriorityClass.INTERACTIVE, f"{a} interactive")
        await eng.release()
        await eng.all_ended()
    cached = {o.name: o.cached_tokens for o in (interactive, mid, batch)}
    assert 0 == cached["interactive"] < cached["mid"] < cached["batch"], cached
