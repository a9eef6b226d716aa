"""What the owner replica takes from a node's KV frames (apps/orchestrator/prefix_feed.py): only from
a version-5 socket that still owns the node, only for a model it registered; Redis trouble is counted,
never the end of the node's socket; a socket that closed because the node went on elsewhere leaves
the new owner's announcements alone."""

from __future__ import annotations

from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from apps.core.protocol import node as proto
from apps.core.scheduling.prefix import block_keys
from apps.orchestrator.connection import NodeConnection
from apps.orchestrator.metrics import Metrics
from apps.orchestrator.prefix_feed import PrefixFeed
from apps.orchestrator.prefix_index import PrefixIndex

BS = 4
TOKENS = list(range(8))


class Store:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail = fail

    async def _call(self, *args: Any) -> None:
        if self.fail:
            raise RedisConnectionError("down")
        self.calls.append(args)

    async def announce(self, node: str, model: str, key: str, blocks: int, conn: str = "") -> None:
        await self._call("announce", node, model, key, blocks)

    async def retract(self, node: str, model: str, keys: list[str]) -> None:
        await self._call("retract", node, model, list(keys))

    async def forget(self, node: str, model: str | None = None) -> None:
        await self._call("forget", node, model)


def _conn(version: int = proto.KV_EVENTS_VERSION) -> NodeConnection:
    return NodeConnection(
        node_id="n1", location="onprem", gpus=1, models={"m": 4}, send_limit=8, monotonic=lambda: 0.0,
        version=version,
    )  # fmt: skip


def _feed(store: Store) -> tuple[PrefixFeed, Metrics]:
    metrics = Metrics(["m"])
    return PrefixFeed(PrefixIndex(), store, metrics), metrics  # type: ignore[arg-type]


STORED = proto.KvEvents(
    model="m", seq=0, events=[proto.KvStoredOp(hashes=[1, 2], parent=None, tokens=TOKENS, block_size=BS)]
)
PREFIX = proto.KvPrefix(model="m", key="b" * 32, block=block_keys(TOKENS, BS)[-1].hex(), blocks=2)


async def test_frames_from_a_v5_owner_are_taken() -> None:
    store = Store()
    feed, metrics = _feed(store)
    await feed.take(_conn(), STORED, owned=True)
    await feed.take(_conn(), PREFIX, owned=True)
    assert store.calls == [("announce", "n1", "m", "b" * 32, 2)]
    assert metrics.prefix_frames_dropped._value.get() == 0


@pytest.mark.parametrize(
    ("version", "owned", "frame"),
    [
        (4, True, STORED),  # an older socket has no such frames
        (proto.KV_EVENTS_VERSION, False, STORED),  # a superseded socket's late frame
        (proto.KV_EVENTS_VERSION, True, STORED.model_copy(update={"model": "other"})),  # not its model
    ],
    ids=["old-socket", "not-owner", "foreign-model"],
)
async def test_frames_a_node_may_not_send_are_dropped(
    version: int, owned: bool, frame: proto.KvEvents
) -> None:
    store = Store()
    feed, metrics = _feed(store)
    await feed.take(_conn(version), frame, owned=owned)
    await feed.take(_conn(version), PREFIX, owned=owned)
    assert store.calls == []
    assert feed.index.engine("n1", "m") is None
    assert metrics.prefix_frames_dropped._value.get() == 2


async def test_redis_trouble_is_counted_not_raised() -> None:
    store = Store(fail=True)
    feed, metrics = _feed(store)
    await feed.take(_conn(), STORED, owned=True)
    await feed.take(_conn(), PREFIX, owned=True)  # the write fails: counted
    await feed.closed(_conn(), proto.CLOSE_NORMAL, elsewhere=False)
    assert metrics.prefix_store_errors._value.get() == 2


async def test_a_socket_closed_because_the_node_went_elsewhere_leaves_its_announcements() -> None:
    store = Store()
    feed, _ = _feed(store)
    await feed.closed(_conn(), proto.CLOSE_SUPERSEDED, elsewhere=True)
    assert store.calls == []  # the new owner's entries stay
    await feed.closed(_conn(), proto.CLOSE_NORMAL, elsewhere=False)
    assert store.calls == [("forget", "n1", None)]


def test_cached_tokens_are_taken_from_a_version_5_done_only() -> None:
    done = proto.Done(request_id="r1", prompt_tokens=40, completion_tokens=3, cached_tokens=32)
    assert _conn().cached_tokens(done) == 32
    assert _conn(version=proto.KV_EVENTS_VERSION - 1).cached_tokens(done) == 0  # an older socket claims none
    assert _conn().cached_tokens(proto.Error(request_id="r1", status=500, message="x")) == 0
    assert _conn().cached_tokens(done.model_copy(update={"cached_tokens": None})) == 0
