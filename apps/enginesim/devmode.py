"""vLLM's dev-mode engine control (`VLLM_SERVER_DEV_MODE=1`), as enginesim serves it with `--dev-mode`.

- `POST /pause?mode=keep|wait&clear_cache=true|false`: vLLM's `pause_generation`. "keep" freezes
  every request (nothing is scheduled); "wait" lets the running requests finish, admits none, and
  answers once nothing runs. `clear_cache` (default true, as vLLM's) puts the running requests back
  into the waiting queue and empties the prefix cache. vLLM's default mode "abort" is not
  simulated: 400.
- `POST /resume`, `GET /is_paused`: as vLLM's.

Requests that arrive while paused wait in the scheduler's queue; the scheduler gauges, a snapshot
of the last engine step as in vLLM, show them only after a step, and a paused engine steps only
when a request is aborted. The conformance suite uses this to hold requests still for as long as
a check needs (`tests/conformance/slots.py`).
"""

from __future__ import annotations

from aiohttp import web

from apps.enginesim.api import STATE_KEY, SimState
from apps.enginesim.engine import PAUSE_MODES


def _state(request: web.Request) -> SimState:
    return request.app[STATE_KEY]


def _error(message: str) -> web.Response:
    # vLLM's RL router answers a bad pause with {"error": str(err)} and 400.
    return web.json_response({"error": message}, status=400)


async def pause(request: web.Request) -> web.Response:
    mode = request.query.get("mode", "abort")
    clear = request.query.get("clear_cache", "true").lower()
    if mode not in PAUSE_MODES:
        return _error(f"pause mode {mode!r} is not simulated by enginesim (known: {', '.join(PAUSE_MODES)})")
    if clear not in ("true", "false", "1", "0"):
        return _error(f"clear_cache must be true or false, got {clear!r}")
    await _state(request).engine.pause(mode, clear_cache=clear in ("true", "1"))
    return web.json_response({"status": "paused"})


async def resume(request: web.Request) -> web.Response:
    _state(request).engine.resume()
    return web.json_response({"status": "resumed"})


async def is_paused(request: web.Request) -> web.Response:
    return web.json_response({"is_paused": _state(request).engine.paused})


def add_dev_routes(app: web.Application) -> None:
    app.router.add_post("/pause", pause)
    app.router.add_post("/resume", resume)
    app.router.add_get("/is_paused", is_paused)
