"""Environment defaults of `llmfleet ops` (env prefix `LLMFLEET_`); its flags win over them.

docs/configuration.md lists the environment names (generated: tools/gen_config_docs.py).
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class OpsSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMFLEET_", extra="ignore", frozen=True)

    prometheus_url: str = Field(
        "http://127.0.0.1:9090", description="Prometheus the jobs query (`--prometheus-url` wins)"
    )
    database_url: str = Field("", description="the ledger's PostgreSQL URL (`--database-url` wins; required)")
    stack: str = Field("dev", description="the stack whose spec applies (`--stack` wins)")
