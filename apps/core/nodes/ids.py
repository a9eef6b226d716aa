"""Node ids and node-pool ids (pure; shared by the token store and the orchestrator's Lua).

A token belongs either to one node (`gpu-07`) or to a pool (`eks`). A pool's token admits
every node id of the form `<pool>/<instance>` (`eks/vllm-8b-7d9f-abcde`): EKS pods get their
names at scheduling time, so they cannot be issued a token each. Token ids never contain
`/`, which keeps `<pool>/<instance>` unambiguous; an instance is everything after the one `/`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from apps.core.errors import InvalidRequest

POOL_SEPARATOR = "/"
MAX_NODE_ID = 128  # the protocol's and the tables' limit, for members too
# A pool token is chosen by the operator (or a Pulumi RandomPassword): refuse guessable ones.
MIN_POOL_TOKEN_CHARS = 32


class TokenKind(enum.StrEnum):
    NODE = "node"
    POOL = "pool"


@dataclass(frozen=True)
class NodeRef:
    """Whose token a node id needs: its own (`pool is None`) or its pool's."""

    node_id: str
    token_id: str
    pool: str | None

    @property
    def kind(self) -> TokenKind:
        return TokenKind.NODE if self.pool is None else TokenKind.POOL


def validate_token_id(token_id: str, *, param: str = "node_id") -> str:
    """A node or pool id that can hold a token: 1..128 characters, no `/`."""
    if not token_id or len(token_id) > MAX_NODE_ID:
        raise InvalidRequest(f"{param} must be 1 to {MAX_NODE_ID} characters", param=param)
    if POOL_SEPARATOR in token_id:
        raise InvalidRequest(
            f"{param} must not contain '{POOL_SEPARATOR}' (reserved for pool members <pool>/<instance>)",
            param=param,
        )
    return token_id


def parse_node_id(node_id: str) -> NodeRef | None:
    """The token a registering node id needs, or None when the id can never be admitted."""
    if not node_id or len(node_id) > MAX_NODE_ID:
        return None
    pool, sep, instance = node_id.partition(POOL_SEPARATOR)
    if not sep:
        return NodeRef(node_id, node_id, None)
    if not pool or not instance or POOL_SEPARATOR in instance:
        return None
    return NodeRef(node_id, pool, pool)


def pool_of(node_id: str) -> str | None:
    ref = parse_node_id(node_id)
    return ref.pool if ref is not None else None
