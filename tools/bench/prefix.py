"""Least-loaded vs prefix-aware picks, side by side in one run (issue 29 item 5).

  .venv/bin/python -m tools.bench prefix [--nodes 4] [--concurrency 16] [--speed 1]
      [--workloads multiturn,shared,random] [--system-prompts 8] [--kv-blocks N] [--repeat 2] [--out FILE]

Method: for each workload, the two policies alternate (`--repeat` times each), every run on a fresh
local platform (one gateway, one orchestrator, `--nodes` 8B enginesim nodes publishing KV events,
their agents forwarding them; real PostgreSQL and Redis): least-loaded is the same platform with
`LLMFLEET_PREFIX_WEIGHT=0`. A closed loop of `--concurrency` clients streams the workload's
requests through the gateway:

- multiturn: conversations of `--turns` turns, each with its own long system prompt; a client
  sends a conversation's next turn (the history, the answer it got, a new question) as soon as the
  previous one ended, clients interleaving conversations;
- shared: `--system-prompts` long system prompts (the apps or teams of a fleet), request n using
  prompt n mod K, a short unique question each;
- random: a unique long prompt per request (nothing to share: the noise reference).

`--engine vllm` runs real vLLM nodes instead (the conformance stage's tiny Llama on the CPU,
`tools/bench/vllm_nodes.py`): a smaller run, for the hit rate and the ratio between the policies
on the real engine; its timings are a CPU's.

`--kv-blocks` gives every engine a smaller KV cache than the profile's, so that a short run reaches
the regime of a real fleet, where the prefixes in use outgrow one engine's cache but not the
fleet's: a least-loaded fleet then caches every prefix everywhere and evicts, a prefix-aware one
keeps each prefix where it was.

Reported per run: TTFT p50/p90 (first content chunk, at the client), output tokens per second,
the engines' prefix-cache hit rate (`vllm:prefix_cache_hits` / `queries`, summed over the nodes,
the engines' own counters) and how evenly the requests spread (each node's share, min-max).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from apps.cli.platform import MODEL_8B, LocalPlatform, NodeSpec, PlatformConfig
from tools.bench.common import DEFAULT_REDIS, admin_pg_url, fresh_database, machine, pct
from tools.bench.vllm_nodes import tiny_model, vllm_node, vllm_python

WORKLOADS = ("multiturn", "shared", "random")
POLICIES = {"least-loaded": "0", "prefix-aware": "0.5"}


def _words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


@dataclass
class Result:
    workload: str
    policy: str
    ttft_s: list[float] = field(default_factory=list)
    tokens: int = 0
    wall_s: float = 0.0
    hits: float = 0.0
    queries: float = 0.0
    per_node: dict[str, float] = field(default_factory=dict)
    errors: int = 0

    def line(self) -> str:
        shares = sorted(self.per_node.values())
        total = sum(shares) or 1.0
        spread = f"{shares[0] / total:.2f}-{shares[-1] / total:.2f}" if shares else "-"
        hit = self.hits / self.queries if self.queries else 0.0
        return (
            f"| {self.workload} | {self.policy} | {pct(self.ttft_s, 0.5) * 1000:.0f} | "
            f"{pct(self.ttft_s, 0.9) * 1000:.0f} | {self.tokens / max(self.wall_s, 1e-9):.0f} | "
            f"{hit:.1%} | {spread} | {self.errors} |"
        )


class Workload:
    """The requests of one workload, handed out to the clients in order."""

    def __init__(self, kind: str, requests: int, turns: int, prompt_words: int, prompts: int = 1) -> None:
        self.kind, self.requests, self.turns, self.words = kind, requests, turns, prompt_words
        self.sent = 0
        self.shared = [
            {"role": "system", "content": _words(f"app{k}policy", prompt_words)}
            for k in range(max(1, prompts))
        ]

    def conversations(self) -> Iterator[list[dict[str, str]] | None]:
        """One client's sequence of first messages (None: continue its own conversation)."""
        while self.sent < self.requests:
            self.sent += 1
            n = self.sent
            if self.kind == "shared":
                yield [
                    self.shared[n % len(self.shared)],
                    {"role": "user", "content": f"question {n}: is claim {n} covered?"},
                ]
            elif self.kind == "random":
                yield [{"role": "user", "content": _words(f"r{n}x", self.words)}]
            else:
                yield [
                    {"role": "system", "content": _words(f"c{n}x", self.words)},
                    {"role": "user", "content": f"first question of conversation {n}"},
                ]


async def _stream(
    client: httpx.AsyncClient, messages: list[dict[str, str]], max_tokens: int
) -> tuple[float, str, int]:
    """(TTFT s, answer text, completion tokens) of one streamed request."""
    body = {"model": MODEL_8B, "messages": messages, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    start, first, text, tokens = time.monotonic(), 0.0, [], 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
            for choice in chunk.get("choices", []):
                content = choice.get("delta", {}).get("content")
                if content:
                    first = first or time.monotonic() - start
                    text.append(content)
    return first, "".join(text), tokens


async def _client(client: httpx.AsyncClient, work: Workload, result: Result, max_tokens: int) -> None:
    for opening in work.conversations():
        assert opening is not None
        messages = list(opening)
        for turn in range(work.turns if work.kind == "multiturn" else 1):
            try:
                ttft, answer, tokens = await _stream(client, messages, max_tokens)
            except httpx.HTTPError:
                result.errors += 1
                break
            result.ttft_s.append(ttft)
            result.tokens += tokens
            messages += [
                {"role": "assistant", "content": answer},
                {"role": "user", "content": f"turn {turn + 2}?"},
            ]


def _engine_totals(platform: LocalPlatform) -> dict[str, tuple[float, float, float]]:
    """Per node: (requests finished, prefix-cache hits, queries), the engines' own counters."""
    out: dict[str, tuple[float, float, float]] = {}
    for node_id, engine in platform.engines.items():
        text = httpx.get(engine.url + "/metrics", timeout=10).text
        sums = dict.fromkeys(("vllm:request_success_total", "vllm:prefix_cache_hits_total",
                              "vllm:prefix_cache_queries_total"), 0.0)  # fmt: skip
        for line in text.splitlines():
            name = line.split("{", 1)[0]
            if name in sums:
                sums[name] += float(line.rsplit(" ", 1)[1])
        done, hits, queries = sums.values()
        out[node_id] = (done, hits, queries)
    return out


@contextmanager
def _platform(args: argparse.Namespace, weight: str) -> Iterator[LocalPlatform]:
    redis_url = os.environ.get("LLMFLEET_REDIS_URL", DEFAULT_REDIS)
    with (
        fresh_database(admin_pg_url(), "llmfleet_prefixbench") as db_url,
        tempfile.TemporaryDirectory(prefix="llmfleet-prefixbench-") as tmp,
    ):
        engine_args = ("--num-blocks", str(args.kv_blocks)) if args.kv_blocks else ()
        if args.engine == "vllm":
            python = vllm_python()
            model_dir = tiny_model(python)
            kv_tokens = (args.kv_blocks or 1024) * 16
            nodes = [
                vllm_node(f"pfx-8b-{i}", MODEL_8B, python, model_dir, Path(tmp), kv_tokens)
                for i in range(args.nodes)
            ]
        else:
            nodes = [
                NodeSpec(f"pfx-8b-{i}", MODEL_8B, "cloud", engine_args=engine_args) for i in range(args.nodes)
            ]
        config = PlatformConfig(
            data_dir=Path(tmp), gateway_port=0, orchestrators=1, nodes=nodes, database_url=db_url,
            redis_url=redis_url, speed=args.speed, ready_timeout_s=120 if args.engine == "enginesim" else 900,
            orchestrator_env={"LLMFLEET_PREFIX_WEIGHT": weight},
            demo_key={"max_streams": 10_000, "rpm": 1_000_000, "tokens_per_day": 10**12},
        )  # fmt: skip
        with LocalPlatform(config) as platform:
            yield platform


def run_one(args: argparse.Namespace, workload: str, policy: str) -> Result:
    result = Result(workload, policy)
    with _platform(args, POLICIES[policy]) as platform:
        assert platform.credentials is not None
        before = _engine_totals(platform)

        async def go() -> None:
            headers = {"Authorization": f"Bearer {platform.credentials.api_key}"}  # type: ignore[union-attr]
            limits = httpx.Limits(max_connections=args.concurrency * 2)
            async with httpx.AsyncClient(base_url=platform.gateway_url, headers=headers, timeout=120,
                                         limits=limits) as client:  # fmt: skip
                work = Workload(workload, args.requests, args.turns, args.prompt_words, args.system_prompts)
                start = time.monotonic()
                await asyncio.gather(
                    *(_client(client, work, result, args.max_tokens) for _ in range(args.concurrency))
                )
                result.wall_s = time.monotonic() - start

        asyncio.run(go())
        after = _engine_totals(platform)
    for node in after:
        done, hits, queries = (a - b for a, b in zip(after[node], before[node], strict=True))
        result.per_node[node] = done
        result.hits += hits
        result.queries += queries
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=64, help="conversations (multiturn) or requests")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--prompt-words", type=int, default=600, help="words of a system or random prompt")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--speed", type=float, default=1.0)
    parser.add_argument("--system-prompts", type=int, default=8, help="distinct system prompts of `shared`")
    parser.add_argument("--kv-blocks", type=int, default=0, help="each engine's KV blocks (0: the profile's)")
    parser.add_argument(
        "--engine",
        choices=("enginesim", "vllm"),
        default="enginesim",
        help="vllm: real vLLM nodes (the tiny Llama on the CPU; `--kv-blocks` counts 16 tokens each, "
        "default 1,024; keep prompts within its 2,048-token context)",
    )
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--repeat", type=int, default=2, help="runs of each policy per workload, alternating")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = ["| workload | policy | TTFT p50 ms | TTFT p90 ms | output tok/s | hit rate | node share | errors |",
            "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for workload in [w for w in args.workloads.split(",") if w]:
        if workload not in WORKLOADS:
            parser.error(f"unknown workload {workload!r} (one of {', '.join(WORKLOADS)})")
        for _ in range(args.repeat):
            for policy in POLICIES:
                rows.append(run_one(args, workload, policy).line())
                print(rows[-1], flush=True)
    about: dict[str, Any] = machine() | vars(args) | {"out": str(args.out)}
    text = "\n".join([json.dumps(about, default=str), "", *rows, ""])
    if args.out is not None:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
