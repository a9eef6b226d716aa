"""Environment of the `llmfleet admin` and `llmfleet dev` commands (env prefix `LLMFLEET_`).

Each is read once when its command starts. docs/configuration.md lists the environment names
(generated: tools/gen_config_docs.py).
"""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from apps.core.nodes.keys import NAMESPACE_PATTERN


class AdminSettings(BaseSettings):
    """`llmfleet admin` (also the migrate Job's containers)."""

    model_config = SettingsConfigDict(env_prefix="LLMFLEET_", extra="ignore", frozen=True)

    database_url: str = Field("postgresql://postgres@127.0.0.1:5432/postgres", description="PostgreSQL URL")
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis URL (register-node-pool)")
    secret_key: SecretStr = Field(
        SecretStr(""), description="server key of the hashes, the gateway's (create-key, register-node-pool)"
    )
    # From the environment only: a token on the command line would show in `ps` and shell history.
    node_token: SecretStr = Field(SecretStr(""), description="the node pool's token (register-node-pool)")
    channel_namespace: str = Field(
        "", pattern=NAMESPACE_PATTERN, description="prefix of the Redis pub/sub channels (the platform's)"
    )


class DevSettings(BaseSettings):
    """`llmfleet dev`: what it connects to instead of starting it; its apps get their own environment."""

    model_config = SettingsConfigDict(env_prefix="LLMFLEET_", extra="ignore", frozen=True)

    database_url: str = Field("", description="PostgreSQL to use (empty: an embedded one)")
    redis_url: str = Field("", description="Redis to use (empty: an embedded one)")
    channel_namespace: str = Field(
        "",
        pattern=NAMESPACE_PATTERN,
        description="prefix of the Redis pub/sub channels (the children read it too)",
    )
    prometheus: str = Field(
        "", description="the prometheus binary of `--prometheus` (empty: the one on PATH)"
    )
