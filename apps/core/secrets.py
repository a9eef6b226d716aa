"""Secrets that are shown once and stored only as keyed hashes: API keys and node tokens.

`new_secret("sk-lf")` -> `sk-lf-<43 url-safe chars>` (256 bits of entropy). The store
keeps `hash_secret(secret, server_key)`: HMAC-SHA256 with a server-side key, so a
leaked table cannot be brute-forced offline without the key either.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets


def new_secret(prefix: str) -> str:
    return f"{prefix}-{secrets.token_urlsafe(32)}"


def hash_secret(secret: str, server_key: bytes) -> str:
    return hmac.new(server_key, secret.encode(), hashlib.sha256).hexdigest()


def secret_matches(secret: str, stored_hash: str, server_key: bytes) -> bool:
    return hmac.compare_digest(hash_secret(secret, server_key), stored_hash)
