"""Unknown routes and wrong methods answer the OpenAI error envelope (not plain text) on the gateway
and on the orchestrator's HTTP API (both real apps: real PostgreSQL and Redis); `GET
/v1/models/{model}` on the gateway."""

from __future__ import annotations

import pytest

from tests.gateway_env import GatewayEnv
from tests.integration.gateway_fixtures import client, gateway
from tests.integration.orchestrator_env import Env

__all__ = ["gateway"]  # the fixture, imported for pytest

MODEL = "llama-3.1-8b-instruct"
BIG = "llama-3.3-70b-instruct-fp8"


def _envelope(body: dict[str, object], code: str) -> None:
    error = body["error"]
    assert isinstance(error, dict)
    assert error["type"] == "invalid_request_error"
    assert error["code"] == code
    assert isinstance(error["message"], str)
    assert error["message"].startswith("Invalid URL (")


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/v1/completions-typo", 404, "unknown_url"),
        ("GET", "/v2/models", 404, "unknown_url"),
        ("POST", "/v1/images/generations", 404, "unknown_url"),
        ("GET", "/v1/embeddings", 405, "method_not_allowed"),
        ("GET", "/v1/chat/completions", 405, "method_not_allowed"),
        ("DELETE", "/v1/models", 405, "method_not_allowed"),
        ("PUT", "/admin/keys", 405, "method_not_allowed"),
    ],
)
async def test_gateway_unknown_routes_and_methods_are_openai_errors(
    gateway: GatewayEnv, method: str, path: str, status: int, code: str
) -> None:
    async with client(gateway) as c:
        r = await c.request(method, path, headers={"Authorization": "Bearer sk-lf-x"})
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    _envelope(r.json(), code)
    if status == 405:
        assert r.headers["allow"]


async def test_gateway_retrieves_a_model_the_caller_may_use(gateway: GatewayEnv) -> None:
    _, key = await gateway.team_with_key("a", model_allowlist=[MODEL])
    auth = {"Authorization": f"Bearer {key}"}
    async with client(gateway) as c:
        ok = await c.get(f"/v1/models/{MODEL}", headers=auth)
        assert ok.status_code == 200, ok.text
        assert ok.json() == {"id": MODEL, "object": "model", "created": 0, "owned_by": "llmfleet"}
        for name in (BIG, "gpt-17", "org/some-model"):  # not allowed, unknown, with a slash
            missing = await c.get(f"/v1/models/{name}", headers=auth)
            assert missing.status_code == 404, missing.text
            assert missing.json()["error"]["code"] == "model_not_found"
            assert missing.json()["error"]["param"] == "model"
        anonymous = await c.get(f"/v1/models/{MODEL}")
        assert anonymous.status_code == 401


async def test_orchestrator_unknown_routes_and_methods_are_openai_errors(env: Env) -> None:
    orch = await env.orchestrator()
    for method, path, status, code in (
        ("GET", "/nope", 404, "unknown_url"),
        ("POST", "/internal/v1/nodes/x/unknown", 404, "unknown_url"),
        ("GET", "/internal/v1/dispatch", 405, "method_not_allowed"),
        ("DELETE", "/livez", 405, "method_not_allowed"),
    ):
        async with env.session.request(method, orch.url + path) as resp:
            assert resp.status == status, await resp.text()
            assert resp.content_type == "application/json"
            _envelope(await resp.json(), code)
            if status == 405:
                assert resp.headers["Allow"]
