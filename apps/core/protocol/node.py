"""Orchestrator <-> agent protocol over one WebSocket opened by the node.

Every frame is one JSON text message with a `type` field. The node's first frame is
`register`; the orchestrator answers `register_ack` or `register_refused` (with a
reason and `retry_after_s`) and closes. A `version` the orchestrator does not know is
refused with WebSocket close code `CLOSE_UNSUPPORTED_VERSION` (4001).

server -> node: register_ack, register_refused, assign, cancel, load_model, drain, handover, done_ack
node -> server: register, heartbeat (every 5 s), chunk, done, error, drained, handed_over, kv_events,
kv_prefix, kv_reset

Version 2 adds one thing to version 1: on a version-2 connection either side may put several
frames in one text message, one per line (`batch_messages`/`split_frames`; compact JSON never
holds a raw newline). A node sends a whole batch (one engine step queues one chunk per running
request) as one message: one WebSocket frame, one mask and one socket write instead of one
each, and one message for the orchestrator to receive; the orchestrator does the same with the
assignments and `done_ack`s queued for a node. An orchestrator that knows only version 1
refuses a version-2 `register` with 4001; the agent then registers with version 1, and that
connection carries one frame per message both ways.

Version 3 adds the socket handover (docs/control-plane.md, "Handover"): a stopping orchestrator
sends `handover {deadline_s}` instead of closing; the node registers on another replica, answers
`handed_over {orchestrator_id, in_flight}` on the old socket, and relays its running requests
there until they end; the old socket then closes with `CLOSE_HANDED_OVER` (4011). A version 1-2
node gets a 1001 close instead; an orchestrator that does not know version 3 refuses it with
4001 and the agent steps down one version per refusal.

Version 5 adds the engine's KV cache events (issue 29): the agent forwards each event batch its
engine publishes as `kv_events {model, seq, events}` (in the engine's order; block hashes as the
engine's 64-bit ints, a stored block's token ids with it) and says `kv_reset {model, reason}` when
the orchestrator must forget what it knows of that engine's cache (a new connection, an engine
restart, a gap the engine's replay buffer could not fill). After a request, the agent announces
which blocks its conversation prefixes fill (`kv_prefix {model, key, block, blocks}`, its engine's
tokenizer counting). Nothing of this is sent on a version 1-4 connection. `assign.cache_scope`
(version 5) is the team's prefix-cache scope: the engine's `cache_salt`, so one team's prompts never
share cached blocks with another's (a version 4 node gets it in the body instead).

Version 6 adds the model revision (issue 30): each `register.models[]` entry names the revision
its engine serves (`revision`, the stack's or the registry's); the orchestrator records it with
every assignment, and the ledger row of each request names it. A version 1-5 frame has no such field.

Version 7 adds the API endpoint (issue 31): `assign.endpoint` is `completions` (`/v1/completions`,
streamed like chat) or `embeddings` (`/v1/embeddings`: one JSON answer, relayed as one chunk whose
single event is the engine's whole body, then `done` with its usage); absent, a chat completion. A
version 1-6 node never gets an assignment with an endpoint (`apps.orchestrator.routing.for_node`):
the request goes to another node of the model.

Version 4 moves the engine's body to the agent (issue 28): `assign` carries the client's body
as the gateway forwarded it plus the request's intent (`budget`, `wants_chunk_usage`,
`priority_class` and, for a resumed stream, `continuation`: the text the client has), and the
agent builds the engine's body once (`apps.core.protocol.engine.engine_body`). A version 1-3 node
gets that body built already (`legacy_assign`), without the new fields.

`chunk.delta` carries the engine's SSE bytes as text, one or more whole
`data: {...}\\n\\n` events, never re-encoded (docs/architecture.md D5). `done` carries the engine's usage
(or, after a cancel, the tokens produced so far) and is repeated until `done_ack`
arrives, so a lost connection never loses or double-counts usage (the ledger settle is
idempotent on `request_id`).
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from apps.core.budget import Budget
from apps.core.sharing import PriorityClass

PROTOCOL_VERSION = 7
SUPPORTED_VERSIONS = frozenset({1, 2, 3, 4, 5, 6, 7})
BATCHING_VERSION = 2  # from this version on a node's message may carry several frames
HANDOVER_VERSION = 3  # from this version on a stopping orchestrator hands its sockets over
INTENT_VERSION = 4  # from this version on `assign` carries intent and the agent builds the engine body
KV_EVENTS_VERSION = 5  # from this version on a node forwards its engine's KV cache events
REVISIONS_VERSION = 6  # from this version on a node names the model revision it serves
ENDPOINTS_VERSION = 7  # from this version on `assign` may name another endpoint than chat

# WebSocket close codes (4000-4999 are for applications).
CLOSE_NORMAL = 1000
CLOSE_UNSUPPORTED_VERSION = 4001
CLOSE_AUTH_FAILED = 4003
CLOSE_REGISTRATION_REFUSED = 4029  # rate limited: retry after `retry_after_s`
CLOSE_REVOKED = 4010
CLOSE_PROTOCOL_ERROR = 4002
CLOSE_SUPERSEDED = 4009  # the same node_id registered again elsewhere
CLOSE_HEARTBEAT_TIMEOUT = 4008  # missed heartbeats: the orchestrator treats the node as dead
CLOSE_GOING_AWAY = 1001  # orchestrator shutting down, no handover (a version 1-2 node): reconnect elsewhere
CLOSE_HANDED_OVER = 4011  # the node registered elsewhere after `handover` and this socket's requests ended


class _Frame(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelInfo(_Frame):
    name: str
    max_num_seqs: int = Field(gt=0)
    max_model_len: int = Field(gt=0)
    revision: str = Field(default="", max_length=128)  # version 6 ("" unknown: an older node)


# -- node -> server ---------------------------------------------------------------


class Register(_Frame):
    type: Literal["register"] = "register"
    node_id: str = Field(min_length=1, max_length=128)
    token: str
    version: int
    gpus: int = Field(ge=0)
    # At least one: a node serving nothing would be registered, heartbeat and count as capacity
    # while no request can ever be routed to it (refused at the handshake, close 4002).
    models: list[ModelInfo] = Field(min_length=1)
    location: Literal["cloud", "onprem"] = "onprem"
    agent_version: str = ""
    in_flight: list[str] = []  # requests still running on this node (after a reconnect)


class Heartbeat(_Frame):
    type: Literal["heartbeat"] = "heartbeat"
    queue_depth: int = Field(ge=0)
    kv_cache_usage: float = Field(ge=0, le=1)
    gpu_util: float | None = Field(default=None, ge=0, le=1)  # absent when no GPU telemetry, never faked
    running: int = Field(default=0, ge=0)
    draining: bool = False


class Chunk(_Frame):
    type: Literal["chunk"] = "chunk"
    request_id: str
    delta: str


class Done(_Frame):
    type: Literal["done"] = "done"
    request_id: str
    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    finish_reason: str | None = None  # stop | length | abort
    usage_event: str | None = None  # the engine's raw usage chunk payload, for clients that asked
    # Version 5: prompt tokens the engine found in its prefix cache (its `prompt_tokens_details`);
    # absent on the wire when None, so a version 1-4 orchestrator never sees the field.
    cached_tokens: int | None = Field(default=None, ge=0)


class Error(_Frame):
    type: Literal["error"] = "error"
    request_id: str
    status: int
    message: str
    error_type: str = "server_error"
    param: str | None = None
    chunks_sent: int = 0  # 0: nothing reached the orchestrator, a retry elsewhere is safe
    prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)


class Drained(_Frame):
    type: Literal["drained"] = "drained"
    reason: str = "drain"


class HandedOver(_Frame):
    """Version 3, on the old socket after `handover`: the node registered on `orchestrator_id`;
    `in_flight` still run here (their frames keep coming on this socket until they end)."""

    type: Literal["handed_over"] = "handed_over"
    orchestrator_id: str
    in_flight: list[str] = []


class KvStoredOp(_Frame):
    """Blocks that entered the engine's prefix cache: `hashes[i]` holds `tokens[i*block_size:(i+1)*block_size]`,
    chained to `parent` (None: the first blocks of a prompt); `extra[i]`, when present, the block's
    extra hash keys (the cache salt of a prompt's first block)."""

    op: Literal["stored"] = "stored"
    hashes: list[int]
    parent: int | None = None
    tokens: list[int]
    block_size: int = Field(gt=0)
    extra: list[list[Any] | None] | None = None


class KvRemovedOp(_Frame):
    op: Literal["removed"] = "removed"
    hashes: list[int]


class KvClearedOp(_Frame):
    op: Literal["cleared"] = "cleared"


KvOp = Annotated[KvStoredOp | KvRemovedOp | KvClearedOp, Field(discriminator="op")]


class KvEvents(_Frame):
    """Version 5: one batch of `model`'s engine events, `seq` the engine's sequence number."""

    type: Literal["kv_events"] = "kv_events"
    model: str = Field(max_length=256)
    seq: int = Field(ge=0)
    events: list[KvOp]


HEX_KEY = r"^[0-9a-f]{32}$"  # a 16-byte key, as `apps.core.scheduling.prefix` makes them


class KvPrefix(_Frame):
    """Version 5: the conversation prefix `key` (apps/core/scheduling/prefix.py) fills `blocks` full
    blocks of `model`'s engine, the last one `block` (its key, as the orchestrator's index names it:
    hex); the engine's own tokenizer said so."""

    type: Literal["kv_prefix"] = "kv_prefix"
    model: str
    key: str = Field(pattern=HEX_KEY)
    block: str = Field(pattern=HEX_KEY)
    blocks: int = Field(gt=0, le=1 << 20)


class KvReset(_Frame):
    """Version 5: forget this node's index of `model` (what follows rebuilds it)."""

    type: Literal["kv_reset"] = "kv_reset"
    model: str
    reason: Literal["connected", "engine_restart", "engine_down", "gap"]


# -- server -> node ---------------------------------------------------------------


class RegisterAck(_Frame):
    type: Literal["register_ack"] = "register_ack"
    orchestrator_id: str
    heartbeat_interval_s: float = 5.0
    unknown_requests: list[str] = []  # in_flight ids the orchestrator no longer relays: cancel them


class RegisterRefused(_Frame):
    type: Literal["register_refused"] = "register_refused"
    reason: str
    retry_after_s: float | None = None


class Assign(_Frame):
    type: Literal["assign"] = "assign"
    request_id: str
    model: str
    body: dict[str, Any]
    # Version 4 (absent before: `body` is then the engine's body, built by the orchestrator).
    budget: Budget | None = None
    wants_chunk_usage: bool | None = None
    priority_class: PriorityClass | None = None
    continuation: str | None = None  # a resumed stream: the assistant text the client has
    # Version 5: the team's prefix-cache scope (the engine's `cache_salt`; apps/core/scheduling/prefix.py).
    cache_scope: str | None = None
    # Version 7: the API endpoint (None: `/v1/chat/completions`).
    endpoint: Literal["completions", "embeddings"] | None = None


INTENT_FIELDS = ("budget", "wants_chunk_usage", "priority_class", "continuation", "cache_scope", "endpoint")


class Cancel(_Frame):
    type: Literal["cancel"] = "cancel"
    request_id: str


class LoadModel(_Frame):
    """Retired: no orchestrator sends it any more (its endpoint answers 501). Kept in the protocol so
    an agent still decodes it from an older orchestrator (and logs and ignores it, as it always did)."""

    type: Literal["load_model"] = "load_model"
    name: str


class Drain(_Frame):
    type: Literal["drain"] = "drain"
    deadline_s: float = 120.0


class Handover(_Frame):
    """Version 3: this replica stops. Register on another one (new assignments go there), keep
    relaying the requests running on this socket here; at `deadline_s` those still running end
    with a `node_draining` error (tokens so far). The socket then closes with 4011."""

    type: Literal["handover"] = "handover"
    deadline_s: float = Field(default=30.0, ge=0)


class DoneAck(_Frame):
    type: Literal["done_ack"] = "done_ack"
    request_id: str


NodeFrame = Annotated[
    Register | Heartbeat | Chunk | Done | Error | Drained | HandedOver | KvEvents | KvPrefix | KvReset,
    Field(discriminator="type"),
]
ServerFrame = Annotated[
    RegisterAck | RegisterRefused | Assign | Cancel | LoadModel | Drain | Handover | DoneAck,
    Field(discriminator="type"),
]
AnyFrame = NodeFrame | ServerFrame

_node_adapter: TypeAdapter[NodeFrame] = TypeAdapter(NodeFrame)
_server_adapter: TypeAdapter[ServerFrame] = TypeAdapter(ServerFrame)


def encode(frame: _Frame) -> str:
    """The one codec: compact JSON, fields in declaration order."""
    if type(frame) is Chunk:
        return encode_chunk(frame.request_id, frame.delta)
    if type(frame) is Assign:  # version-4 fields only when set: a version 1-3 frame stays as it was
        return frame.model_dump_json(exclude={f for f in INTENT_FIELDS if getattr(frame, f) is None})
    if type(frame) is Done and frame.cached_tokens is None:  # a version 1-4 frame stays as it was
        return frame.model_dump_json(exclude={"cached_tokens"})
    if type(frame) is Register and not any(m.revision for m in frame.models):  # a version 1-5 frame
        return frame.model_dump_json(exclude={"models": {"__all__": {"revision"}}})
    return frame.model_dump_json()


def decode_node_frame(text: str | bytes) -> NodeFrame:
    """Parse a frame sent by a node; raises `pydantic.ValidationError` on anything else."""
    return _node_adapter.validate_json(text)


MESSAGE_MAX_CHARS = 1 << 20  # a batched message's bound (a larger single frame goes alone)


def join_frames(texts: list[str]) -> str:
    """Several encoded frames as one message (version 2), one per line."""
    return "\n".join(texts)


def batch_messages(texts: list[str], max_chars: int = MESSAGE_MAX_CHARS) -> list[str]:
    """Frames queued together as version-2 messages, in order, at most `max_chars` each."""
    messages: list[str] = []
    group: list[str] = []
    size = 0
    for text in texts:
        if group and size + len(text) > max_chars:
            messages.append(join_frames(group))
            group, size = [], 0
        group.append(text)
        size += len(text) + 1
    if group:
        messages.append(join_frames(group))
    return messages


def split_frames(text: str) -> list[str]:
    """The frames of one message: one, or (version 2) several, one per line."""
    return text.split("\n") if "\n" in text else [text]


def decode_server_frame(text: str | bytes) -> ServerFrame:
    """Parse a frame sent by the orchestrator."""
    return _server_adapter.validate_json(text)


# -- hot path: `chunk` frames -----------------------------------------------------------
#
# One `chunk` frame crosses the socket per engine read per request, so it is the one frame
# worth a hand-written encoder: `encode_chunk` is byte-identical to `model_dump_json` (tested
# against pydantic and the golden fixtures: `"`, `\\` and control characters escaped the
# same way, non-ASCII kept as UTF-8) at a third of the cost. Decoding stays with pydantic:
# measured, `validate_json` of a chunk (~1.5 us) is cheaper than `json.loads` plus
# `model_construct` (~5 us).

_CHUNK_PREFIX = '{"type":"chunk","request_id":'


def encode_chunk(request_id: str, delta: str) -> str:
    """`encode(Chunk(request_id=..., delta=...))`, without building the model."""
    return _CHUNK_PREFIX + encode_basestring(request_id) + ',"delta":' + encode_basestring(delta) + "}"


def peek_version(text: str) -> int | None:
    """The `version` of a register frame before full validation (so a v2 frame with new
    fields is refused with 4001, not 4002)."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    version = data.get("version") if isinstance(data, dict) else None
    return version if isinstance(version, int) else None
