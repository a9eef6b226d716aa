"""`client.models.retrieve` and an unknown route through the official `openai` SDK (the gateway
served by uvicorn, real PostgreSQL and Redis)."""

from __future__ import annotations

import openai
import pytest

from tests.gateway_env import gateway_env

MODEL = "llama-3.1-8b-instruct"


async def test_models_retrieve_and_unknown_routes(migrated_db_url: str, redis_url: str) -> None:
    async with gateway_env(migrated_db_url, redis_url, serve=True) as env:
        _, key = await env.team_with_key("a", model_allowlist=[MODEL])
        async with openai.AsyncOpenAI(base_url=env.base_url + "/v1", api_key=key, max_retries=0) as client:
            model = await client.models.retrieve(MODEL)
            assert (model.id, model.object, model.owned_by) == (MODEL, "model", "llmfleet")
            with pytest.raises(openai.NotFoundError) as hidden:
                await client.models.retrieve("llama-3.3-70b-instruct-fp8")  # outside the allowlist
            assert hidden.value.code == "model_not_found"
            with pytest.raises(openai.NotFoundError) as unknown:
                await client.images.generate(model=MODEL, prompt="hi")  # a route the gateway lacks
            assert unknown.value.code == "unknown_url"
            assert "Invalid URL (POST /v1/images/generations)" in unknown.value.message
            with pytest.raises(openai.BadRequestError) as wrong:
                await client.embeddings.create(model=MODEL, input="hi")  # a chat model embeds nothing
            assert (wrong.value.code, wrong.value.param) == ("unsupported_model", "model")
