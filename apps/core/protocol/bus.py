"""Orchestrator pub/sub messages (Redis), typed: one model per `op`, on two kinds of channel.

`nodech:{node_id}` (to whichever replica holds the node's socket): `assign`, `cancel`, `drain`,
`load_model`, `revoke`, `supersede`. `orch:{replica}` (back to the replica relaying a forwarded
request): `frame` (a node frame as the node sent it) and `lost`. JSON with an `op` field; a message
that does not decode is dropped by the receiver (a newer replica's op an older one does not know).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class _Msg(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class AssignMsg(_Msg):
    op: Literal["assign"] = "assign"
    origin: str
    request_id: str
    model: str
    body: dict[str, Any] = Field(default_factory=dict)  # the engine's body (for a replica before version 4)
    assign: dict[str, Any] | None = None  # the `assign` frame (node protocol version 4), intent included


class CancelMsg(_Msg):
    op: Literal["cancel"] = "cancel"
    request_id: str


class DrainMsg(_Msg):
    op: Literal["drain"] = "drain"


class LoadModelMsg(_Msg):
    """Retired (`load_model` answers 501): decoded from an older replica and dropped."""

    op: Literal["load_model"] = "load_model"
    name: str


class RevokeMsg(_Msg):
    op: Literal["revoke"] = "revoke"


class SupersedeMsg(_Msg):
    op: Literal["supersede"] = "supersede"
    conn: str  # the connection that registered last; every other one of the node closes


class FrameMsg(_Msg):
    op: Literal["frame"] = "frame"
    request_id: str
    frame: str  # the node's frame text, decoded by the relaying replica


class LostMsg(_Msg):
    op: Literal["lost"] = "lost"
    request_id: str
    reason: str  # "unreachable" (nothing ran) or a `LostReason` value


class HandoverMsg(_Msg):
    """From a stopping replica to the relay of a request on one of its nodes: the node registers
    elsewhere, but this request's frames keep coming from here until it ends (or a `lost`)."""

    op: Literal["handover"] = "handover"
    request_id: str


NodeMessage = Annotated[
    AssignMsg | CancelMsg | DrainMsg | LoadModelMsg | RevokeMsg | SupersedeMsg, Field(discriminator="op")
]
ReplicaMessage = Annotated[FrameMsg | LostMsg | HandoverMsg, Field(discriminator="op")]

_NODE: TypeAdapter[NodeMessage] = TypeAdapter(NodeMessage)
_REPLICA: TypeAdapter[ReplicaMessage] = TypeAdapter(ReplicaMessage)


def encode(message: _Msg) -> str:
    return message.model_dump_json()


def decode_node_message(data: str | bytes) -> NodeMessage:
    """Raises `pydantic.ValidationError` for anything that is not a node-channel message."""
    return _NODE.validate_json(data)


def decode_replica_message(data: str | bytes) -> ReplicaMessage:
    return _REPLICA.validate_json(data)
