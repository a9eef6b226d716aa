"""Environment defaults of `llmfleet model-sync` (env prefix `LLMFLEET_`); its flags win over them.

docs/configuration.md lists the environment names (generated: tools/gen_config_docs.py).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class ModelSyncSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMFLEET_")

    model_bucket: str | None = Field(None, description="S3 bucket of the models (`--bucket` wins)")
    model_cache_dir: Path = Field(Path("/models"), description="the models' cache root (`--dest` wins)")
    s3_endpoint_url: str | None = Field(None, description="S3 endpoint override (`--endpoint-url` wins)")
    aws_region: str | None = Field(None, description="AWS region of the S3 and KMS clients")
    model_signing_key: str | None = Field(
        None, description="KMS key (id, ARN or alias) that signs model manifests; model-sync verifies with it"
    )
    database_url: str = Field(
        "", description="the platform's PostgreSQL, where `llmfleet model canary` keeps the live revisions"
    )
    model_verify_key: Path | None = Field(
        None, description="a local public key (PEM) model-sync verifies manifests with instead of KMS (dev)"
    )
    gateway_url: str = Field(
        "", description="the gateway's /v1 URL `llmfleet model eval` runs the golden set through"
    )
    eval_api_key: SecretStr | None = Field(
        None, description="an admin JWT `llmfleet model eval` pins the evaluated revision with"
    )
