"""After a request ended well: which blocks its conversation prefixes fill, announced to the
orchestrator (`kv_prefix`, protocol version 5) so that every replica's picker finds this node for the
conversation's next turn.

The orchestrator keeps an announcement only if this engine's events already stored the block it names
(`apps/orchestrator/prefix_index.py`), and the events and the answer reach the agent on two channels
that nothing orders: the engine publishes its events from a background thread, the answer comes over
HTTP. Under load the request's `done` is often here before the batch holding its blocks was read. So
an announcement waits, each wait bounded, for what it needs, in this order: a connection to send on,
the engine's block size (learnt from its first stored block), the engine's tokenizer, and the batch
that stored its last block sent ahead of it on the same socket. An announcement that is given up is
counted by reason in `dropped` and logged at info level (never the conversation: only the reason).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

from apps.core.protocol import node as proto
from apps.core.scheduling.prefix import block_keys, chat_messages, prefix_keys

log = logging.getLogger("llmfleet.agent")

Send = Callable[[proto._Frame], Awaitable[bool]]
TokenIds = Callable[[dict[str, Any]], Awaitable[list[int] | None]]
ANNOUNCING_MAX = 4  # announcements running at once (each asks the engine's tokenizer); more are dropped
CONNECT_WAIT_S = 10.0  # a request can end before the registration's `connected` ran
BLOCK_SIZE_WAIT_S = 5.0  # the first request's `done` can come before any stored block was read
STORED_WAIT_S = 5.0  # the batch storing the announced block, sent ahead of the announcement
TAILS_MAX = 1 << 17  # stored blocks remembered by their tokens (more than a large GPU holds)


def _tail(tokens: Sequence[int], n: int, size: int) -> int:
    """The n-th full block of `tokens`, as remembered of the stored blocks (by its tokens alone: this
    only orders the announcement after its events; the orchestrator checks the chain)."""
    return hash(tuple(tokens[(n - 1) * size : n * size]))


class Announcer:
    def __init__(self, model: str, link: Callable[[], Send | None]) -> None:
        self.model = model
        self.link = link  # the forwarder's current connection (None: not connected)
        self.token_ids: TokenIds | None = None  # the engine's tokenizer (`EngineClient.token_ids`)
        self.block_size: int | None = None  # the engine's, from its first stored block
        self.announced = 0
        self.dropped: Counter[str] = Counter()
        self._tails: OrderedDict[int, None] = OrderedDict()  # stored blocks sent to the orchestrator
        self._progress = asyncio.Event()  # set (and replaced) whenever what announcements wait for moves
        self._running: set[asyncio.Future[None]] = set()

    def attach(self, token_ids: TokenIds) -> Callable[[proto.Assign], None]:
        """The engine's tokenizer; what the agent calls after each request that ended well."""
        self.token_ids = token_ids
        return self.request_done

    def moved(self) -> None:
        """A connection came, or a batch was sent: wake the announcements that wait."""
        self._progress.set()
        self._progress = asyncio.Event()

    def sent(self, frame: proto.KvEvents) -> None:
        """A batch went to the orchestrator: remember its stored blocks, and the engine's block size."""
        for op in frame.events:
            if isinstance(op, proto.KvStoredOp):
                self.block_size = op.block_size
                for n in range(1, len(op.hashes) + 1):
                    key = _tail(op.tokens, n, op.block_size)
                    self._tails[key] = None
                    self._tails.move_to_end(key)
        while len(self._tails) > TAILS_MAX:
            self._tails.popitem(last=False)
        self.moved()

    def request_done(self, assign: proto.Assign) -> None:
        """A request ended well: announce its prefixes in the background (never on its path)."""
        if self.token_ids is None:
            return
        if len(self._running) >= ANNOUNCING_MAX:
            self._drop("busy")
            return
        task = asyncio.ensure_future(self._quietly(assign.body, assign.cache_scope))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def settled(self) -> None:
        """Every announcement running now has been sent or given up (the agent's tests; a shutdown)."""
        await asyncio.gather(*self._running, return_exceptions=True)

    async def _quietly(self, body: dict[str, Any], scope: str | None) -> None:
        try:
            await self.announce(body, scope)
        except Exception:  # the engine or the session went away: a missed announcement, nothing more
            log.info("kv_prefix_announce_failed", extra={"model": self.model}, exc_info=True)
            self.dropped["failed"] += 1

    async def announce(self, body: dict[str, Any], scope: str | None = None) -> None:
        """The whole conversation (the next turn's start) and its first message (a system prompt other
        conversations share). `scope`: the team's cache scope, the engine's `cache_salt`, which its
        first block's hash holds too."""
        messages, token_ids = chat_messages(body), self.token_ids
        if not messages or token_ids is None:
            return
        if not await self._until(lambda: self.link() is not None, CONNECT_WAIT_S):
            return self._drop("not_connected")
        if not await self._until(lambda: self.block_size is not None, BLOCK_SIZE_WAIT_S):
            return self._drop("block_size_unknown")
        size = self.block_size
        assert size is not None
        keys = prefix_keys(messages, body.get("tools"), scope)
        salt = [scope] if scope else None
        for k in sorted({len(messages), 1}):
            tokens = await token_ids({**body, "messages": list(messages[:k])})
            if tokens is None:
                self._drop("tokenizer")
                continue
            blocks = block_keys(tokens, size, salt)
            if not blocks:
                continue  # shorter than a block: nothing the engine could reuse
            tail = _tail(tokens, len(blocks), size)
            if not await self._until(partial(self._tails.__contains__, tail), STORED_WAIT_S):
                self.dropped["unseen"] += 1  # sent all the same: the orchestrator's index decides
            send = self.link()
            if send is None:
                return self._drop("not_connected")
            frame = proto.KvPrefix(
                model=self.model, key=keys[k - 1], block=blocks[-1].hex(), blocks=len(blocks)
            )
            if await send(frame):
                self.announced += 1
            else:
                self._drop("send_failed")

    async def _until(self, ready: Callable[[], bool], within_s: float) -> bool:
        """Wait for `ready()`, woken by `moved`, at most `within_s` seconds."""
        try:
            async with asyncio.timeout(within_s):
                while not ready():
                    await self._progress.wait()
        except TimeoutError:
            return ready()
        return True

    def _drop(self, reason: str) -> None:
        self.dropped[reason] += 1
        log.info("kv_prefix_announce_dropped", extra={"model": self.model, "reason": reason})
