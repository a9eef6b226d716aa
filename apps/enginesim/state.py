"""What every route of one simulator instance shares: `SimState` (the engine, its metrics, faults and
switches), the `--timing-log` writer, and vLLM's way of writing JSON and error bodies."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import IO, Any, Literal

from aiohttp import web

from apps.enginesim.engine import Engine
from apps.enginesim.errors import VllmError
from apps.enginesim.faults import FaultBox
from apps.enginesim.metrics import EngineMetrics
from apps.enginesim.profiles import EngineProfile

Runner = Literal["generate", "pooling"]


def _compact(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def json_response(body: Any, status: int = 200) -> web.Response:
    """vLLM answers compact JSON (Starlette's JSONResponse)."""
    return web.json_response(body, status=status, dumps=_compact)


def error_response(exc: VllmError) -> web.Response:
    return json_response(exc.body(), status=exc.status)


SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


@dataclass
class TimingLog:
    """Per streamed request: when it arrived and when its first content chunk was written
    (`time.monotonic()`, so a client on the same machine can subtract the engine's own TTFT from
    its own and keep only the time spent in transit). One JSON line per request, appended.

    Lines wait in memory and go out in one write once no timed stream is open any more (the end of
    a load run) or `batch` of them are pending, so the log costs no syscall per request while a
    run is going. Only the `user` tag and two clocks are written: never prompt or completion text.
    """

    path: str
    batch: int = 256
    open_streams: int = 0
    _pending: list[str] = field(default_factory=list)
    _file: IO[str] | None = None

    def record(self, user: str | None, arrived: float, first_content: float) -> None:
        line = {"user": user, "arrived": arrived, "first_content": first_content}
        self._pending.append(json.dumps(line, separators=(",", ":")) + "\n")

    def stream_ended(self) -> None:
        self.open_streams -= 1
        if self.open_streams == 0 or len(self._pending) >= self.batch:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open, closed in close()
        self._file.write("".join(self._pending))
        self._file.flush()
        self._pending.clear()

    def close(self) -> None:
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None


@dataclass
class SimState:
    served_model: str
    profile: EngineProfile
    engine: Engine
    metrics: EngineMetrics
    faults: FaultBox
    seed: int
    timing: TimingLog | None = None  # `--timing-log`: None costs nothing per request
    prefix_caching: bool = True  # vLLM's `--enable-prefix-caching` (its default)
    prompt_details: bool = False  # `--enable-prompt-tokens-details`
    runner: Runner = "generate"  # vLLM's `--runner`: which endpoints the engine serves
    embedding_dim: int = 1024  # `--embedding-dim`: the length of a pooling engine's vectors


STATE_KEY = web.AppKey("enginesim_state", SimState)


def fault_error(status: int, message: str) -> VllmError:
    """The body of the `fail_status` fault: vLLM's envelope with the status's error type."""
    type_ = {
        400: "BadRequestError",
        401: "AuthenticationError",
        404: "NotFoundError",
        429: "RateLimitError",
        500: "InternalServerError",
        501: "NotImplementedError",
        503: "ServiceUnavailableError",
    }.get(status, "InternalServerError")
    return VllmError(status, type_, message)
