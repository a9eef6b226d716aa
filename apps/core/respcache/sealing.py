"""A team's response cache keys (docs/response-cache.md): derived with HKDF-SHA256 from the gateway's
secret key and the team's random 32-byte salt (`response_cache_keys`), under a label of their own, so
they are independent of every other use of that secret. 64 bytes: an AES-256-GCM key for the answers and
an HMAC-SHA256 key for the match keys. Deleting a team's salt (a purge, or the team) leaves its entries
unreadable even where a copy of the table survives (a backup).

A sealed answer is `nonce (12 bytes) || AES-GCM(answer)`, its associated data the entry's team, model,
revision and exact key: an entry copied to another team's or model's row does not open.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

LABEL = b"llmfleet response cache v1"
SALT_BYTES = 32
NONCE_BYTES = 12


def new_salt() -> bytes:
    return os.urandom(SALT_BYTES)


class Unsealable(Exception):
    """The sealed answer does not open with this key and these associated data."""


@dataclass(frozen=True)
class TeamKey:
    team_id: int
    aead: AESGCM
    hmac_key: bytes

    @classmethod
    def derive(cls, secret: bytes, team_id: int, salt: bytes) -> TeamKey:
        info = LABEL + b" team " + str(team_id).encode()
        material = HKDF(algorithm=hashes.SHA256(), length=64, salt=salt, info=info).derive(secret)
        return cls(team_id, AESGCM(material[:32]), material[32:])

    def _aad(self, model: str, revision: str, exact_key: bytes) -> bytes:
        return b"\n".join((str(self.team_id).encode(), model.encode(), revision.encode(), exact_key))

    def seal(self, plain: bytes, model: str, revision: str, exact_key: bytes) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self.aead.encrypt(nonce, plain, self._aad(model, revision, exact_key))

    def open(self, sealed: bytes, model: str, revision: str, exact_key: bytes) -> bytes:
        try:
            return self.aead.decrypt(
                sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], self._aad(model, revision, exact_key)
            )
        except (InvalidTag, ValueError):
            raise Unsealable() from None
