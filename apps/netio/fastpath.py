"""Which fast paths are on, and the metric of which path served.

Every fast path in this package writes on a framework's transport behind its back (see README.md
next to this file). Each one is:

* switched by the app's `netio_fastpaths` setting (read once at start-up, docs/configuration.md):
  unset or `on` = all on,
  `off` = all off (every write takes the framework's public API), or a comma-separated list of
  the paths to keep on (`uvicorn_chunk,aiohttp_chunk`), so each can be measured on and off;
* counted in `llmfleet_netio_path_total{path, mode}`: `mode="fast"` for the pieces the fast path
  wrote, `mode="fallback"` for the ones that went through the public API (the probe declined, the
  switch is off, or the peer was slow at that moment).
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter

UVICORN_CHUNK: Final = "uvicorn_chunk"  # gateway: relayed chunk framed onto uvicorn's transport
AIOHTTP_CHUNK: Final = "aiohttp_chunk"  # orchestrator: relayed chunk framed onto aiohttp's transport
PATHS: Final = (UVICORN_CHUNK, AIOHTTP_CHUNK)
# Removed on 2026-12-01 (measured within the noise, docs/performance.md): `aiohttp_ws_frame` and
# `engine_first_piece`, the agent's synchronous first-chunk write from the engine socket's callback.


def enabled(path: str, switch: str) -> bool:
    """Whether the fast path `path` may be used under `switch`, an app's `netio_fastpaths` setting
    (the capability probe decides whether it can)."""
    value = switch.strip().lower()
    if value in ("", "on", "1", "true", "all"):
        return True
    if value in ("off", "0", "false", "none"):
        return False
    return path in {name.strip() for name in value.split(",")}


class PathMetrics:
    """`llmfleet_netio_path_total` on one app's registry. Hot loops count in plain ints and call
    `served` once per stream or connection, not once per chunk."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.total = Counter(
            "llmfleet_netio_path",
            "Pieces written by a netio fast path (fast) or through the framework's public API (fallback)",
            ["path", "mode"],
            registry=registry,
        )
        self._children = {
            (path, mode): self.total.labels(path=path, mode=mode)
            for path in PATHS
            for mode in ("fast", "fallback")
        }

    def served(self, path: str, fast: int = 0, fallback: int = 0) -> None:
        if fast:
            self._children[(path, "fast")].inc(fast)
        if fallback:
            self._children[(path, "fallback")].inc(fallback)
