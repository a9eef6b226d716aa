"""The sharing model through the whole local platform (gateway, orchestrator, agents, enginesim
running vLLM's priority policy) with the official OpenAI SDK: a `batch` key and an `interactive`
key both complete (the engine accepts both priorities), and `GET /admin/queues` answers."""

from __future__ import annotations

import httpx
import openai
import pytest

from apps.cli.platform import DEMO_TEAM, MODEL_8B
from tests.chaos.conftest import PlatformFactory

pytestmark = pytest.mark.chaos


def test_batch_and_interactive_keys_complete_end_to_end(make_platform: PlatformFactory) -> None:
    platform = make_platform()
    creds = platform.credentials
    assert creds is not None
    admin = {"Authorization": f"Bearer {creds.admin_token}"}
    with httpx.Client(base_url=platform.gateway_url, headers=admin, timeout=30) as c:
        r = c.post("/admin/keys", json={"team": DEMO_TEAM, "priority_class": "batch"})
        assert r.status_code == 201, r.text
        batch_key = r.json()["key"]
        r = c.post("/admin/teams/sharing", json={"team": DEMO_TEAM, "weight": 3})
        assert r.status_code == 200, r.text
        board = c.get("/admin/queues")
        assert board.status_code == 200
        assert MODEL_8B in {m["model"] for m in board.json()["data"]}
    for key in (batch_key, creds.api_key):
        with openai.OpenAI(base_url=creds.base_url, api_key=key, max_retries=0) as client:
            stream = client.chat.completions.create(
                model=MODEL_8B, messages=[{"role": "user", "content": "hi"}], max_tokens=8, stream=True
            )
            text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        assert text
