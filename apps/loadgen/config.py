"""What one load run does: target, shape of the load, and request shape."""

from __future__ import annotations

from dataclasses import dataclass

from apps.core.errors import SpecError


@dataclass(frozen=True)
class LoadConfig:
    base_url: str  # OpenAI-style base, e.g. http://127.0.0.1:8000/v1 (a bare host gets /v1 added)
    model: str
    api_key: str = ""
    concurrency: int = 1  # closed loop: streams in flight; open loop: the cap on streams in flight
    requests: int | None = None  # stop after this many requests ...
    duration_s: float | None = None  # ... or after this long (one of the two; default 1 request per stream)
    rate: float | None = None  # open loop: Poisson arrivals per second
    ramp_s: float = (
        0.0  # closed loop: spread the streams' first requests evenly over this long (steady arrivals)
    )
    prompt_tokens: int = 128
    max_tokens: int = 128
    abandon_after: int | None = None  # drop each stream after K content chunks (leak tests)
    ignore_eos: bool = True  # exact completion lengths from vLLM-compatible engines
    include_usage: bool = True
    request_timeout_s: float = 300.0
    seed: int = 0
    # Tag every request with `user: "<tag>-<index>"` so an engine-side timing log can be joined to
    # the client's results request by request (benchmarks: the platform's transit time).
    tag: str | None = None

    def validate(self) -> LoadConfig:
        if not self.base_url.startswith(("http://", "https://")):
            raise SpecError(
                f"--base-url must start with http:// or https://, got {self.base_url!r}", param="base_url"
            )
        for name in ("concurrency", "prompt_tokens", "max_tokens"):
            if getattr(self, name) < 1:
                raise SpecError(f"--{name.replace('_', '-')} must be at least 1", param=name)
        if self.requests is not None and self.requests < 1:
            raise SpecError("--requests must be at least 1", param="requests")
        if self.duration_s is not None and self.duration_s <= 0:
            raise SpecError("--duration must be greater than 0", param="duration")
        if self.rate is not None and self.rate <= 0:
            raise SpecError("--rate must be greater than 0", param="rate")
        if self.ramp_s < 0:
            raise SpecError("--ramp must be 0 or more seconds", param="ramp")
        if self.ramp_s and self.rate is not None:
            raise SpecError(
                "--ramp applies to the closed loop; the open loop (--rate) has its own arrivals", param="ramp"
            )
        if self.abandon_after is not None and self.abandon_after < 1:
            raise SpecError("--abandon-after must be at least 1", param="abandon_after")
        if self.tag is not None and not self.tag:
            raise SpecError("--tag must not be empty", param="tag")
        return self

    @property
    def chat_url(self) -> str:
        base = self.base_url.rstrip("/")
        if not base.endswith("/v1"):
            base += "/v1"
        return base + "/chat/completions"

    @property
    def total_requests(self) -> int | None:
        """Requests to send; None means "until the duration is over"."""
        if self.requests is not None:
            return self.requests
        if self.duration_s is not None:
            return None
        return self.concurrency
