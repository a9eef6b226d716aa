"""`python -m tools.bench cache` (`tools/bench/cache*.py`): its requests (a reworded question is a semantic
match, other rounds' are not), its client's timing of a streamed answer, its arithmetic (paired by round,
answers with the wrong cache header left out) and its page; no servers."""

from __future__ import annotations

import argparse
import asyncio
import random
from typing import Any

import pytest

from apps.core.spec import load_spec
from apps.enginesim.vectors import cosine, embed
from tools.bench import cache
from tools.bench.cache_client import Answer, Connection
from tools.bench.cache_report import HITS, MISSES, Arm, Run, bootstrap_ci, compare, render

pytestmark = pytest.mark.timeout(30)

DIMS = load_spec("dev").models["bge-m3"].embedding_dimensions or 0


def test_a_reworded_question_is_a_semantic_match_and_never_an_exact_one() -> None:
    first, second = cache.question("ab", 7), cache.question("ab", 8)
    again = cache.reworded(first)
    assert again != first
    assert cosine(embed(first, DIMS), embed(again, DIMS)) >= 0.9  # the bench's default threshold
    assert cosine(embed(first, DIMS), embed(second, DIMS)) < 0.5  # another round's question: a miss
    body = cache.body(first, 16)
    assert body["temperature"] == 0  # cacheable under the default policy (max_temperature 0)
    assert body["stream"] is True


def test_each_round_orders_every_arm_once() -> None:
    rng = random.Random(0)
    orders = [cache.shuffled(MISSES, rng) for _ in range(20)]
    assert all(sorted(o) == sorted(MISSES) for o in orders)
    assert len({tuple(o) for o in orders}) > 1  # not one fixed order: no arm always follows the same one


def _answer(total: float, cache_header: str = "miss", status: int = 200) -> Answer:
    return Answer(status, cache_header, total / 10, total / 5, total)


def _arm(name: str, expect: str, totals: dict[int, float]) -> Arm:
    arm = Arm(name, name, expect, False, "")
    for round_, total in totals.items():
        assert arm.add(round_, _answer(total, expect), 0.004, 0.010)
    return arm


def test_an_answer_with_another_cache_header_or_status_is_left_out() -> None:
    arm = Arm("exact_hit", "exact", "hit", False, "")
    assert not arm.add(0, _answer(0.01, "miss"), 0.001, 0.001)
    assert not arm.add(1, _answer(0.01, "hit", status=429), 0.001, 0.001)
    assert arm.add(2, _answer(0.01, "hit"), 0.001, 0.001)
    assert (arm.n, arm.unexpected, arm.gateway_cpu) == (1, 2, [0.001])


def test_the_comparison_pairs_samples_by_round() -> None:
    off = _arm("off", "", {0: 0.100, 1: 0.200, 2: 0.300, 3: 0.400})
    exact = _arm("exact", "miss", {0: 0.101, 1: 0.202, 2: 0.303, 5: 0.900})  # round 3 missing, 5 unpaired
    c = compare(exact, off, "total")
    assert c.pairs == 3
    assert c.paired_median_ms == pytest.approx(2.0)  # differences 1, 2, 3 ms
    assert c.added_median_ms == pytest.approx((0.2525 - 0.25) * 1000)  # medians of each arm's own samples
    assert c.ratio_median == pytest.approx(0.2525 / 0.25)
    assert c.paired_ci_ms[0] <= c.paired_median_ms <= c.paired_ci_ms[1]


def test_the_bootstrap_interval_is_reproducible_and_brackets_the_median() -> None:
    values = [i / 1000 for i in range(1, 60)]
    low, high = bootstrap_ci(values)
    assert (low, high) == bootstrap_ci(values)
    assert low < 0.030 < high


class _Transport:
    def __init__(self) -> None:
        self.sent = b""

    def write(self, data: bytes) -> None:
        self.sent += data

    def is_closing(self) -> bool:
        return False


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n" % len(payload) + payload + b"\r\n"


async def test_the_client_times_a_streamed_answer_and_reads_its_cache_header() -> None:
    conn = Connection()
    conn.connection_made(_Transport())  # type: ignore[arg-type]
    pending = conn.request(b"POST / HTTP/1.1\r\n\r\n")
    head = b"HTTP/1.1 200 OK\r\nX-LLMFleet-Cache: hit\r\nTransfer-Encoding: chunked\r\n\r\n"
    role = _chunk(b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n')
    conn.data_received(head + role)
    assert not pending.done()
    conn.data_received(_chunk(b'data: {"choices":[{"delta":{"content":"Yes"}}]}\n\n'))
    assert not pending.done()
    conn.data_received(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    answer = await asyncio.wait_for(pending, 1)
    assert (answer.status, answer.cache) == (200, "hit")
    assert answer.first_token_s is not None
    assert answer.first_byte_s <= answer.first_token_s <= answer.total_s


async def test_an_error_answer_has_no_first_token() -> None:
    conn = Connection()
    conn.connection_made(_Transport())  # type: ignore[arg-type]
    pending = conn.request(b"POST / HTTP/1.1\r\n\r\n")
    body = b'{"error":{"message":"no"}}'
    conn.data_received(b"HTTP/1.1 429 Too Many\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    answer = await asyncio.wait_for(pending, 1)
    assert (answer.status, answer.cache, answer.first_token_s) == (429, "", None)


def test_metrics_are_summed_per_name_and_label() -> None:
    text = "\n".join(
        [
            "# HELP x y",
            'llmfleet_gateway_cache_lookup_seconds_sum{model="m",match="exact"} 0.5',
            'llmfleet_gateway_cache_lookup_seconds_sum{model="n",match="exact"} 0.25',
            'llmfleet_gateway_cache_lookup_seconds_count{model="m",match="semantic"} 3.0',
            'llmfleet_gateway_cache_requests_total{team="1",model="m",result="miss"} 2.0',
            "vllm:e2e_request_latency_seconds_sum 1.5",
        ]
    )
    out = cache.parse_metrics(text, "match|result")
    assert out["llmfleet_gateway_cache_lookup_seconds_sum|exact"] == 0.75
    assert out["llmfleet_gateway_cache_lookup_seconds_count|semantic"] == 3.0
    assert out["llmfleet_gateway_cache_requests_total|miss"] == 2.0
    assert cache.parse_metrics(text)["vllm:e2e_request_latency_seconds_sum"] == 1.5


def test_the_page_has_every_arm_its_method_and_the_servers_figures() -> None:
    totals = {r: 0.25 + r / 1000 for r in range(5)}
    arms = {name: _arm(name, "hit" if name in HITS else "miss", totals) for name in (*MISSES, *HITS)}
    gateway = {
        "llmfleet_gateway_cache_lookup_seconds_sum|exact": 0.01,
        "llmfleet_gateway_cache_lookup_seconds_count|exact": 10.0,
        "llmfleet_gateway_cache_requests_total|exact_hit": 5.0,
    }
    engine = {"vllm:time_to_first_token_seconds_sum": 0.1, "vllm:time_to_first_token_seconds_count": 5.0}
    run = Run(arms, {"gateway": gateway, "llama-3.1-8b-instruct": engine}, 12.0, True, (0.5, 0.5))
    args: Any = argparse.Namespace(requests=5, warmup=1, max_tokens=16, speed=1.0, threshold=0.9, gap_ms=60.0)
    page = render(args, {"date": "today"}, run)
    for name in (*MISSES, *HITS):
        assert f"| `{name}` | 5 |" in page
    assert "5 counted rounds after 1 warm-up rounds" in page
    assert "exact mean 1.00 ms over 10" in page
    assert "exact_hit 5" in page
    assert "time to first token mean 20.00 ms over 5" in page
    assert "| `exact_hit` vs `exact` | 5 / 5 |" in page
