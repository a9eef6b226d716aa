"""Settlement on the replica holding the node's socket.

`done` (and an `error` after output started) becomes a `SettleJob` handled by a small
pool of workers, so neither a slow PostgreSQL nor Redis blocks a node's reader. A job first
frees the request's node slot and writes the usage to `done:{request_id}` in Redis (one
script: the record the sweeper settles from if this replica dies before the settle commits),
then settles through `settle_usage`, and only
after the commit sends `done_ack`, so the agent forgets the request only once it is
billed. A `done` from a node that does not hold the assignment (`req:{id}` absent: the request
was never assigned, e.g. still queued; or naming the node it was retried or resumed on) is
acknowledged without settling (issue 27). The completion reported is held against the events the
node relayed (`tolerance.py`).
A resumed stream's second node settles the whole request (`resume.py` states the rule); a
mid-stream `error` of the first node of a stream that may resume is not settled here (the relay
resumes it or settles that report itself).

What this leaves unsettled the sweeper settles (`sweeper.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from apps.core.nodes import keys
from apps.core.nodes.store import as_text
from apps.core.protocol.node import DoneAck
from apps.orchestrator.connection import NodeConnection
from apps.orchestrator.fleet import Fleet
from apps.orchestrator.logs import event
from apps.orchestrator.metrics import Metrics
from apps.orchestrator.plane import SettleFn
from apps.orchestrator.settle_lua import ADD_RELAYED_LUA, RECORD_DONE_LUA
from apps.orchestrator.tolerance import UsageTolerance


@dataclass(frozen=True)
class SettleJob:
    node_id: str
    request_id: str
    prompt_tokens: int
    completion_tokens: int
    ack_to: NodeConnection | None  # send `done_ack` here after the commit (None: an error frame)
    from_error: bool = False  # an `error` frame after output started (not a `done`)
    # A `done(abort)` with no relay on its socket: an agent's journal replay after its socket to
    # another replica dropped (it aborts then). Its relay, if alive, may still resume the stream.
    replayed_abort: bool = False
    # Content events this socket relayed for the request (None: it did not carry it; a journal
    # replay of an assignment on an earlier socket, whose count is in `req:{id}`.relayed).
    relayed: int | None = None
    # The socket the report came on. A report this socket had no assignment for when it came (relayed
    # None) while it has one by the time the report is settled was sent before that assignment: it is
    # not for it (a hostile node reporting a queued request; under load its settle ran after the
    # request was assigned to it, and billed the report unchecked).
    source: NodeConnection | None = None
    cached_tokens: int = 0  # prompt tokens the engine found in its prefix cache (a version-5 `done`)


class Settler:
    def __init__(
        self,
        redis: Redis,
        fleet: Fleet,
        settle: SettleFn,
        metrics: Metrics,
        *,
        queue_size: int,
        record_ttl_s: int,
        channel_namespace: str,
        on_slot_freed: Callable[[], None] = lambda: None,
        on_overreport: Callable[[str, str], Awaitable[None]] | None = None,
        tolerance: UsageTolerance | None = None,
    ) -> None:
        self._redis = redis
        self._on_overreport = on_overreport
        self._on_slot_freed = on_slot_freed
        self._fleet = fleet
        self._settle = settle
        self._metrics = metrics
        self._queue: asyncio.Queue[SettleJob] = asyncio.Queue(maxsize=queue_size)
        self._ttl = record_ttl_s
        self._namespace = channel_namespace
        self._tolerance = tolerance or UsageTolerance()
        self._record_done = redis.register_script(RECORD_DONE_LUA)
        self._add_relayed = redis.register_script(ADD_RELAYED_LUA)
        self.idle = asyncio.Event()
        self.idle.set()
        self._busy = 0
        self._locks: dict[str, list[Any]] = {}  # request id -> [its lock, jobs holding or awaiting it]

    @contextlib.asynccontextmanager
    async def _ordered(self, request_id: str) -> AsyncIterator[None]:
        """Hold the request's lock (FIFO); forgotten when no job of the request holds or awaits it."""
        entry = self._locks.get(request_id)
        if entry is None:
            entry = self._locks[request_id] = [asyncio.Lock(), 0]
        entry[1] += 1
        try:
            async with entry[0]:
                yield
        finally:
            entry[1] -= 1
            if entry[1] == 0:
                del self._locks[request_id]

    async def submit(self, job: SettleJob) -> None:
        self.idle.clear()
        if job.ack_to is not None:
            job.ack_to.settling += 1  # until its ack is queued (or it failed): `_worker`
        await self._queue.put(job)

    async def run(self, workers: int) -> None:
        async with asyncio.TaskGroup() as tg:
            for _ in range(workers):
                tg.create_task(self._worker())

    async def _worker(self) -> None:
        while True:
            job = await self._queue.get()
            self._busy += 1
            try:
                # Reports for one request are handled in the order they arrived (the first one
                # keeps the socket's relayed count for any later one: `RECORD_DONE_LUA`). The lock
                # is taken in the same step as the `get`, so queue order is lock order.
                async with self._ordered(job.request_id):
                    await self.handle(job)
            except Exception as exc:
                # The done record stays in Redis and the agent replays the unacked done.
                self._metrics.settles.labels(outcome="error").inc()
                event("settle_failed", logging.WARNING, request_id=job.request_id, error=type(exc).__name__)
                with contextlib.suppress(Exception):  # the slot, if the script never ran (else a no-op)
                    await self._fleet.release_slot(job.node_id, job.request_id)
                self._on_slot_freed()
            finally:
                if job.ack_to is not None:
                    job.ack_to.settling -= 1
                self._busy -= 1
                if self._queue.empty() and self._busy == 0:
                    self.idle.set()

    def _sent_before_its_assignment(self, job: SettleJob) -> bool:
        """Not for the assignment this socket has now (`SettleJob.source`): refused before the
        script, which would also free the slot of that assignment."""
        if job.relayed is None and job.source is not None and job.request_id in job.source.relayed:
            self._refuse_early(job)
            return True
        return False

    def _refuse_early(self, job: SettleJob) -> None:
        self._metrics.settles.labels(outcome="not_assigned").inc()
        event("done_before_assigned", logging.WARNING, node_id=job.node_id, request_id=job.request_id)
        self._ack(job)

    async def _record(self, job: SettleJob) -> Any:
        """The settle script (`RECORD_DONE_LUA`): its answer."""
        record = {
            "node": job.node_id,
            "prompt_tokens": job.prompt_tokens,
            "completion_tokens": job.completion_tokens,
            "cached_tokens": job.cached_tokens,  # the sweeper bills them as this settle would
        }
        return await self._record_done(
            keys=[
                keys.request_key(job.request_id),
                keys.done_key(job.request_id),
                keys.node_inflight(job.node_id),
            ],
            args=[
                job.node_id,
                json.dumps(record),
                self._ttl,
                job.request_id,
                "1" if await self._defer(job) else "0",
                "" if job.relayed is None else job.relayed,
                self._tolerance.tokens_per_event,
                self._tolerance.slack_tokens,
                "" if job.source is None else job.source.conn_id,
            ],
        )

    async def handle(self, job: SettleJob) -> None:
        if self._sent_before_its_assignment(job):
            return
        answer = await self._record(job)
        recorded, freed = int(answer[0]), int(answer[1])
        if recorded == 4:  # sent before its assignment reached this socket (the script's first rule)
            self._refuse_early(job)
            return
        if freed:
            self._fleet.slot_freed(job.node_id)
        self._on_slot_freed()
        if recorded in (0, 3):
            # Not this node's request (any more): nothing is recorded or settled. Acked, so an
            # agent replaying an old report forgets it.
            self._metrics.settles.labels(outcome="superseded" if recorded == 0 else "not_assigned").inc()
            if recorded == 3:
                event("done_not_assigned", logging.WARNING, node_id=job.node_id, request_id=job.request_id)
            self._ack(job)
            return
        if int(answer[6]) == 1:
            await self._unrelayed(job, int(answer[7]))
        elif int(answer[6]) == 2:
            self._capped_after_lost_socket(job, int(answer[7]))
        if recorded == 2:
            self._metrics.settles.labels(outcome="deferred_resume").inc()
            self._ack(job)  # a replayed done: its record is in Redis now, the agent may forget it
            return
        prompt, completion, platform = int(answer[3]), int(answer[4]), int(answer[5])
        if int(answer[2]):
            await self._overreported(job, prompt, completion)
        result = await self._settle(
            job.request_id,
            prompt,
            completion,
            resume_prompt_tokens=platform,
            # Never more than what is billed; none for a resumed stream (the second node's cache
            # saw its own prompt, the resume's, which is platform cost).
            cached_prompt_tokens=0 if platform else min(job.cached_tokens, prompt),
            node_id=job.node_id,  # the audit trail: the node that produced the tokens, and its revision
            model_revision=as_text(answer[8]) or None,
        )
        self._metrics.settles.labels(outcome=result.outcome.value).inc()
        self._metrics.writeoff.inc(result.written_off_microcredits)
        self._ack(job)

    async def _defer(self, job: SettleJob) -> bool:
        """Leave the report to the relay (it resumes the stream, and the second node settles it
        whole, or it settles this report): a mid-stream error, or a replayed abort whose relaying
        replica is alive (someone hears its channel). The relay of a replica that died resumes
        nothing: its replayed abort settles now, the tokens the node produced."""
        if job.from_error:
            return True
        if not job.replayed_abort:
            return False
        origin = await self._redis.hget(keys.request_key(job.request_id), "origin")
        if not origin:
            return False
        replica = origin.decode() if isinstance(origin, bytes) else str(origin)
        channel = keys.replica_channel(replica, namespace=self._namespace)
        [(_, listeners)] = await self._redis.pubsub_numsub(channel)
        return int(listeners) > 0

    async def _overreported(self, job: SettleJob, prompt_bound: int, completion_bound: int) -> None:
        """A node reported more than the request could produce (the engine was told the bound):
        settle the bound, flag the node and take it out of routing."""
        self._metrics.overreported.inc()
        event(
            "usage_overreported",
            logging.WARNING,
            node_id=job.node_id,
            request_id=job.request_id,
            reported_prompt_tokens=job.prompt_tokens,
            reported_completion_tokens=job.completion_tokens,
            settled_prompt_tokens=prompt_bound,
            settled_completion_tokens=completion_bound,
        )
        if self._on_overreport is not None:
            await self._on_overreport(job.node_id, "usage_overreported")

    async def _unrelayed(self, job: SettleJob, events: int) -> None:
        """A node reported more completion tokens than it relayed (beyond the tolerance): the
        relayed count was settled; flag the node and take it out of routing."""
        self._metrics.unrelayed.inc()
        event(
            "usage_unrelayed",
            logging.WARNING,
            node_id=job.node_id,
            request_id=job.request_id,
            reported_completion_tokens=job.completion_tokens,
            relayed_events=events,
        )
        if self._on_overreport is not None:
            await self._on_overreport(job.node_id, "usage_unrelayed")

    def _capped_after_lost_socket(self, job: SettleJob, events: int) -> None:
        """A report on a later socket (the agent's journal replay) beyond what the closed sockets
        relayed: settled at the relayed count, like `_unrelayed`, but the node stays in routing. The
        chunks it wrote into the dying socket, and the tokens its engine made until the agent aborted
        the request, never reached the relay; an honest node's report exceeds the count then, and
        quarantining it took a healthy node out of the fleet after every lost connection (a loaded
        CI run lost its only node this way). A node gains nothing by dropping its socket: the
        team pays the relayed count either way."""
        self._metrics.unrelayed_after_lost_socket.inc()
        event(
            "usage_capped_after_lost_socket",
            node_id=job.node_id,
            request_id=job.request_id,
            reported_completion_tokens=job.completion_tokens,
            relayed_events=events,
        )

    async def keep_relayed(self, conn: NodeConnection) -> None:
        """A socket closes: keep the events it relayed for requests it got no report for in
        `req:{id}`.relayed, where a report on the node's next socket finds them."""
        counts = conn.take_relayed()
        if not counts:
            return
        try:
            await self._add_relayed(
                keys=[keys.request_key(r) for r in counts], args=[conn.node_id, *counts.values()]
            )
        except Exception as exc:  # Redis unreachable: the teardown goes on (a replay is then unchecked)
            event("relayed_not_kept", logging.WARNING, node_id=conn.node_id, error=type(exc).__name__)

    @staticmethod
    def _ack(job: SettleJob) -> None:
        if job.ack_to is not None:
            job.ack_to.send(DoneAck(request_id=job.request_id))
