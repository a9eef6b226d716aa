"""Who may read a process's `/metrics` (issue 27): the series name teams (by id) and nodes.

- With a metrics token (`LLMFLEET_METRICS_TOKEN`): only a scrape sending `Authorization: Bearer
  <token>` (401 otherwise), on whichever port serves `/metrics`.
- Without one: the dedicated metrics port (`LLMFLEET_METRICS_PORT`, which a NetworkPolicy opens to
  Prometheus alone), or, when `/metrics` shares the API port, loopback clients only (`llmfleet dev`
  and its Prometheus); anyone else gets a 404, as if there were no metrics there.
"""

from __future__ import annotations

import hmac
import ipaddress

from apps.core.errors import AuthenticationFailed, LlmfleetError, NotFound

NOT_HERE = (
    "Metrics are served on the metrics port, to loopback clients, or with the metrics token "
    "(LLMFLEET_METRICS_PORT / LLMFLEET_METRICS_TOKEN)."
)


def _loopback(host: str | None) -> bool:
    if not host:
        return False
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return host == "localhost"


def metrics_refusal(
    *, token: str, authorization: str | None, client_host: str | None, on_metrics_port: bool
) -> LlmfleetError | None:
    """None if this scrape may read the metrics, else the error to answer with."""
    if token:
        given = (authorization or "").removeprefix("Bearer ").strip()
        if given and hmac.compare_digest(given.encode(), token.encode()):
            return None
        return AuthenticationFailed("A metrics scrape needs the metrics token.", code="invalid_metrics_token")
    if on_metrics_port or _loopback(client_host):
        return None
    return NotFound(NOT_HERE, code="not_found")
