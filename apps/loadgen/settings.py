"""Environment defaults of `llmfleet loadgen` (env prefix `LLMFLEET_`); its flags win over them.

docs/configuration.md lists the environment names (generated: tools/gen_config_docs.py).
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class LoadgenSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMFLEET_", extra="ignore", frozen=True)

    api_key: str = Field("", description="API key sent as `Authorization: Bearer` (`--api-key` wins)")
