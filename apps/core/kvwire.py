"""vLLM 0.32's KV cache events on the wire (`vllm/distributed/kv_events.py`): the structs enginesim
publishes and the agent decodes, and the publisher's framing.

Each engine step with events is one ZMQ PUB message of three frames: the topic, an 8-byte
big-endian sequence number (from 0, no gaps) and a msgpack payload, an `EventBatch` array
`[ts, events, data_parallel_rank]` whose events are maps tagged `"type"`. The publisher's ROUTER
socket answers a replay request `[b"", start_seq]` with every buffered batch from `start_seq`
(`[b"", topic, seq, payload]`), then `[b"", b"", END_SEQ, b""]`.

Block hashes are 64-bit integers by default (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`: the lower 64
bits of the engine's hash); with it off they are the hash's bytes, which `as_int` maps the same way.
Fields this module does not name are ignored when decoding (a newer engine may add some).
"""

from __future__ import annotations

from typing import Any

import msgspec

END_SEQ = (-1).to_bytes(8, "big", signed=True)  # the end of a replay
MASK_64 = (1 << 64) - 1


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


_decoder = msgspec.msgpack.Decoder(KVEventBatch)


def decode_batch(payload: bytes) -> KVEventBatch:
    """One published payload (msgspec.DecodeError / ValidationError when it is not one)."""
    return _decoder.decode(payload)


def as_int(block_hash: int | bytes) -> int:
    """A block hash as vLLM publishes it by default: an int, or the lower 64 bits of its bytes."""
    if isinstance(block_hash, bytes):
        return int.from_bytes(block_hash, "big") & MASK_64
    return block_hash & MASK_64


def engine_binds(endpoint: str) -> bool:
    """vLLM's rule for its PUB socket: it binds a wildcard, `ipc://` or `inproc://` endpoint and
    connects to any other (`tcp://127.0.0.1:5557`: the subscriber binds that one)."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def seq_of(frame: bytes) -> int:
    """The sequence number frame of a published message or of a replay answer (-1: the end)."""
    return int.from_bytes(frame, "big", signed=True)
