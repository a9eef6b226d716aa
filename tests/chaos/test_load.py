"""Chaos 1 and 5: 200 streams with a 2k-token prompt through the whole path (zero errors,
ledger drift exactly 0), and one key opening 500 streams with `max_streams` = 10."""

from __future__ import annotations

import asyncio
import threading

import pytest
import redis

from apps.loadgen.runner import run_load
from tests.chaos.conftest import PlatformFactory
from tests.chaos.helpers import engines_running, http_text, ledger_totals, load_8b, metric_sum, wait_until

pytestmark = pytest.mark.chaos


def _engine_tokens(platform: object) -> tuple[float, float]:
    from apps.cli.platform import LocalPlatform

    assert isinstance(platform, LocalPlatform)
    prompt = completion = 0.0
    for engine in platform.engines.values():
        text = http_text(engine.url + "/metrics")
        prompt += metric_sum(text, "vllm:prompt_tokens_total")
        completion += metric_sum(text, "vllm:generation_tokens_total")
    return prompt, completion


def test_200_streams_2k_prompt_zero_errors_and_zero_ledger_drift(
    make_platform: PlatformFactory, migrated_db_url: str
) -> None:
    platform = make_platform()
    config = load_8b(platform, concurrency=200, requests=200, prompt_tokens=2048, max_tokens=64)
    report = asyncio.run(run_load(config)).to_json()
    print("200 streams x 2k prompt:", {k: report[k] for k in ("requests", "ttft_ms", "output_tokens_per_s")})
    assert report["requests"]["error"] == 0, report["errors_by_status"]
    assert report["requests"]["ok"] == 200

    totals = wait_until(
        lambda: (t := ledger_totals(migrated_db_url)).settled == 200 and t.reserved == 0 and t,
        30,
        "every request settled",
    )
    engine_prompt, engine_completion = _engine_tokens(platform)
    assert totals.completion_tokens == 200 * 64
    assert totals.completion_tokens == engine_completion  # drift exactly 0
    assert totals.prompt_tokens == engine_prompt


def test_one_key_500_streams_max_streams_10_exactly_10_run(
    make_platform: PlatformFactory, redis_url: str
) -> None:
    platform = make_platform(demo_key={"max_streams": 10})
    # max_tokens: long enough that the 10 admitted streams outlive the 490 refusals.
    config = load_8b(platform, concurrency=500, requests=500, prompt_tokens=64, max_tokens=400)
    client = redis.Redis.from_url(redis_url)
    seen: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            running = int(engines_running(platform))
            slots = sum(
                int(client.scard(k)) for k in client.scan_iter("streams:*") if not k.endswith(b":lease")
            )
            seen.append(max(running, slots))
            stop.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        report = asyncio.run(run_load(config)).to_json()
    finally:
        stop.set()
        sampler.join(10)
        client.close()
    print(
        "500 streams, max_streams=10:", report["requests"], report["errors_by_status"], "max seen", max(seen)
    )
    ok = report["requests"]["ok"]
    assert ok >= 10
    assert report["requests"]["ok"] + report["errors_by_status"].get("429", 0) == 500
    assert max(seen) == 10  # never more than 10, and the limit was actually reached
