"""Fault injection for chaos tests: what a broken engine looks like from outside.

Set per instance by CLI flags at start and at run time by `POST /_sim/faults` (replace),
`GET /_sim/faults`, `DELETE /_sim/faults` (clear). Times are wall-clock seconds, NOT scaled by
`--speed`: they target the platform's own deadlines (first token, idle between chunks).

- `die_after_tokens: k`  a streaming request's TCP connection is dropped (no `[DONE]`, no error
  event) after `k` content chunks; `k = 0` drops it right after the response headers.
- `stall_s: t` (with `stall_after_tokens: k`, default 0) a stream stops producing for `t` seconds
  after `k` content chunks, then continues.
- `error_after_tokens: k` after `k` content chunks the stream carries vLLM's in-stream error event
  (`data: {"error": {..., "type": "InternalServerError", "code": 500}}`) then `data: [DONE]`, as
  0.32 does when the engine dies mid-stream.
- `fail_status: s` (`fail_message`) requests are answered with HTTP `s` and vLLM's error body.
- `times: n` the fault hits the next `n` requests, then clears itself (unset: every request).

Faults hit chat and legacy completion requests alike (`generation.py`); an embedding request
(a pooling engine) takes them too, but only `fail_status` acts on it (it streams nothing).
- `loading_s: t` (CLI only) the port refuses connections for `t` seconds at start, as vLLM does
  while it loads the model.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Faults(BaseModel):
    model_config = ConfigDict(extra="forbid")

    die_after_tokens: int | None = Field(default=None, ge=0)
    stall_s: float | None = Field(default=None, gt=0)
    stall_after_tokens: int = Field(default=0, ge=0)
    error_after_tokens: int | None = Field(default=None, ge=0)
    fail_status: int | None = Field(default=None, ge=400, le=599)
    fail_message: str = "Simulated engine failure."
    times: int | None = Field(default=None, ge=1)

    @property
    def active(self) -> bool:
        return any(
            v is not None
            for v in (self.die_after_tokens, self.stall_s, self.fail_status, self.error_after_tokens)
        )


class FaultBox:
    """The current faults of one instance; `take()` hands them to one request and counts `times`."""

    def __init__(self, initial: Faults | None = None) -> None:
        self.current = initial or Faults()

    def set(self, faults: Faults) -> None:
        self.current = faults

    def clear(self) -> None:
        self.current = Faults()

    def take(self) -> Faults:
        faults = self.current
        if not faults.active:
            return faults
        if faults.times is not None:
            left = faults.times - 1
            self.current = faults.model_copy(update={"times": left}) if left > 0 else Faults()
        return faults
