"""The gateway closes an idle kept-alive client connection only after its clients' pools drop it.

The orchestrator roll chaos test saw an `httpx.ReadError` during plain load, before any replica
stopped: uvicorn's default keep-alive (5 s) equalled httpx's pool expiry (5 s, also the OpenAI
SDKs'), so a client could send its next request on a pooled connection at the moment the gateway
closed it, and read a reset. The server must keep a connection longer than any client keeps it.
"""

from __future__ import annotations

import httpx

from apps.gateway.cli import uvicorn_config
from apps.gateway.settings import GatewaySettings


def test_the_gateway_keeps_idle_connections_well_past_httpx_pools_expiry() -> None:
    client_expiry = httpx.Limits().keepalive_expiry  # httpx's default, and the OpenAI SDKs'
    assert client_expiry is not None
    config = uvicorn_config(object(), GatewaySettings.model_validate({}))
    # Well past it, not just past: the client's clock starts when it gets the response back, the
    # server's when it wrote it, and a loaded machine can run the two a second or more apart.
    assert config.timeout_keep_alive >= 2 * client_expiry + 10
