"""Replica, GPU, cost and queue arithmetic for a fleet. Pure functions."""

from __future__ import annotations

from dataclasses import dataclass

from apps.core.errors import SpecError
from apps.core.sizing.kv import ceil_div

HOURS_PER_MONTH = 730


def replicas_for_load(peak_streams: float, streams_per_replica: int, headroom: float = 0.0) -> int:
    """`ceil(peak x (1 + headroom) / streams_per_replica)`; never below load / target."""
    if peak_streams < 0:
        raise SpecError(f"peak_streams must not be negative, got {peak_streams}", param="peak_streams")
    if streams_per_replica <= 0:
        raise SpecError(
            f"streams_per_replica must be greater than 0, got {streams_per_replica}",
            param="streams_per_replica",
        )
    if headroom < 0:
        raise SpecError(f"headroom must not be negative, got {headroom}", param="headroom")
    return ceil_div(peak_streams * (1 + headroom), streams_per_replica)


@dataclass(frozen=True)
class FleetTotals:
    gpus_peak: int
    gpus_onprem: int
    gpus_cloud: int


def fleet_totals(gpus_per_model: dict[str, int], onprem_gpus: int) -> FleetTotals:
    """Total GPUs at peak; on-premises GPUs are used first, the rest is cloud."""
    if onprem_gpus < 0:
        raise SpecError(f"onprem gpus must not be negative, got {onprem_gpus}", param="onprem")
    peak = sum(gpus_per_model.values())
    used_onprem = min(onprem_gpus, peak)
    return FleetTotals(gpus_peak=peak, gpus_onprem=used_onprem, gpus_cloud=peak - used_onprem)


def cost_per_hour(gpus: float, price_per_gpu_hour: float) -> float:
    if price_per_gpu_hour < 0:
        raise SpecError(f"price_per_gpu_hour must not be negative, got {price_per_gpu_hour}", param="price")
    return gpus * price_per_gpu_hour


def cost_per_month(average_gpus: float, price_per_gpu_hour: float, hours: float = HOURS_PER_MONTH) -> float:
    return cost_per_hour(average_gpus, price_per_gpu_hour) * hours


def tokens_per_hour(tokens_per_s: float) -> float:
    return tokens_per_s * 3600


def cost_per_million_tokens(
    gpus: float, price_per_gpu_hour: float, tokens_per_s: float, utilisation: float = 1.0
) -> float:
    """USD per million tokens of `gpus` handling `tokens_per_s` at full load, at `utilisation` (output
    tokens of a generate model, prompt tokens of an embed model)."""
    if tokens_per_s <= 0:
        raise SpecError(f"tokens_per_s must be greater than 0, got {tokens_per_s}", param="tokens_per_s")
    if not 0 < utilisation <= 1:
        raise SpecError(f"utilisation must be in (0, 1], got {utilisation}", param="utilisation")
    return cost_per_hour(gpus, price_per_gpu_hour) / (tokens_per_hour(tokens_per_s) * utilisation / 1e6)


@dataclass(frozen=True)
class QueueBudget:
    service_time_s: float
    requests_per_s_per_replica: float
    burst_per_replica: float


def queue_budget(
    answer_tokens: int, tokens_per_s_per_stream: float, streams_per_replica: int, queue_limit_s: float
) -> QueueBudget:
    """How long one answer takes, how many a replica finishes per second, and how many a queue limit holds."""
    if answer_tokens <= 0:
        raise SpecError(f"answer_tokens must be greater than 0, got {answer_tokens}", param="answer_tokens")
    if tokens_per_s_per_stream <= 0:
        raise SpecError(
            f"tokens_per_s_per_stream must be greater than 0, got {tokens_per_s_per_stream}",
            param="tokens_per_s_per_stream",
        )
    if streams_per_replica <= 0:
        raise SpecError(
            f"streams_per_replica must be greater than 0, got {streams_per_replica}",
            param="streams_per_replica",
        )
    if queue_limit_s <= 0:
        raise SpecError(f"queue_limit_s must be greater than 0, got {queue_limit_s}", param="queue_limit_s")
    service = answer_tokens / tokens_per_s_per_stream
    rps = streams_per_replica / service
    return QueueBudget(
        service_time_s=service, requests_per_s_per_replica=rps, burst_per_replica=rps * queue_limit_s
    )
