"""The prefix announcements every replica's picker reads (Redis; issue 29).

The owner replica of a node's socket writes `pfx:{model}:{key}` -> {node: blocks} when the node
announces a conversation prefix whose last block its engine holds (`kv_prefix`, checked against the
node's KV events in `PrefixIndex`), and deletes it when the engine evicts that block, when the node
resets its index, and when its socket closes. A pick reads every looked-up key of its request in
one round trip (`matches`). Entries expire after `ttl_s` even if no retraction ever came (a replica
killed with its sockets open): a stale entry costs a missed cache hit, never a wrong answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from redis.asyncio import Redis

from apps.core.nodes import keys
from apps.core.nodes.store import as_text

TTL_S = 3600


class PrefixStore:
    def __init__(self, redis: Redis, ttl_s: int = TTL_S) -> None:
        self._redis = redis
        self._ttl_s = ttl_s

    async def announce(self, node_id: str, model: str, key: str, blocks: int, conn: str = "") -> None:
        """`conn`: the node's socket: an entry of an earlier socket (a replica killed before it could
        retract) is not believed once the node registered again (`matches`)."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.hset(keys.prefix_key(model, key), node_id, f"{blocks}:{conn}")
        pipe.expire(keys.prefix_key(model, key), self._ttl_s)
        pipe.sadd(keys.prefix_node(node_id), f"{model}:{key}")
        pipe.expire(keys.prefix_node(node_id), self._ttl_s)
        await pipe.execute()

    async def retract(self, node_id: str, model: str, prefix_keys: Iterable[str]) -> None:
        pipe = self._redis.pipeline(transaction=False)
        members = []
        for key in prefix_keys:
            pipe.hdel(keys.prefix_key(model, key), node_id)
            members.append(f"{model}:{key}")
        if not members:
            return
        pipe.srem(keys.prefix_node(node_id), *members)
        await pipe.execute()

    async def forget(self, node_id: str, model: str | None = None) -> None:
        """Every announcement of the node (of `model` only, when given)."""
        members = [as_text(m) for m in await self._redis.smembers(keys.prefix_node(node_id))]
        chosen = [m for m in members if model is None or m.rpartition(":")[0] == model]
        if not chosen:
            return
        pipe = self._redis.pipeline(transaction=False)
        for member in chosen:
            m, _, key = member.rpartition(":")  # the key is hex: a model name may hold a `:`
            pipe.hdel(keys.prefix_key(m, key), node_id)
        pipe.srem(keys.prefix_node(node_id), *chosen)
        await pipe.execute()

    async def matches(
        self, model: str, prefix_keys: Sequence[str], conns: Mapping[str, str] | None = None
    ) -> dict[str, int]:
        """Node id -> blocks of the longest of `prefix_keys` (given longest first) it holds; with
        `conns` (node id -> its current socket), only entries that socket announced."""
        if not prefix_keys:
            return {}
        pipe = self._redis.pipeline(transaction=False)
        for key in prefix_keys:
            pipe.hgetall(keys.prefix_key(model, key))
        found: dict[str, int] = {}
        for entry in await pipe.execute():
            for raw_node, raw_value in entry.items():
                node = as_text(raw_node)
                blocks, _, conn = as_text(raw_value).partition(":")
                if conns is not None and conns.get(node) != conn:
                    continue  # announced by a socket the node no longer has
                found.setdefault(node, int(blocks))
        return found
