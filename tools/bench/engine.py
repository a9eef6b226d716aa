"""Engine benchmarks: enginesim's 8B profile, loadgen's own overhead, real vLLM (docs/performance.md).

Usage (from the repository root):

    .venv/bin/python -m tools.bench engine [--vllm-python /var/cache/llmfleet/vllm-venv/bin/python] [--skip-vllm]

Prints one JSON document. Every figure is a ratio or a side-by-side comparison taken in the same
run on the same machine (never a fixed threshold):
- `enginesim_8b`: loadgen (closed loop, 256-token prompts, 400 output tokens, one wave) against
  `llmfleet enginesim --model llama-3.1-8b-instruct` at speed 1 with 1, 32 and 64 streams;
- `loadgen_overhead`: 200 streams against enginesim (8B profile, `--max-num-seqs 256`); the client's
  mean inter-token gap next to the engine's own (from `vllm:inter_token_latency_seconds`), and
  loadgen's CPU time per received chunk;
- `vllm_cpu`: loadgen against the real vLLM 0.32 (tiny model, CPU) at 1 and 8 streams.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from apps.cli.procs import llmfleet_argv
from apps.loadgen.config import LoadConfig
from apps.loadgen.runner import run_load
from tools.bench.common import Child, Supervisor, free_port, repo_root

REPO = repo_root()

EIGHT_B = "llama-3.1-8b-instruct"


def _metric_sum(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name)


def _enginesim(sup: Supervisor, *extra: str) -> tuple[Child, str]:
    port = free_port()
    child = sup.start(
        f"enginesim-{port}", llmfleet_argv("enginesim", "--model", EIGHT_B, "--port", str(port), *extra)
    )
    sup.wait_http_ok(child, f"http://127.0.0.1:{port}/health", 30)
    return child, f"http://127.0.0.1:{port}"


def _summary(j: dict[str, Any]) -> dict[str, Any]:
    return {
        "requests_ok": j["requests"]["ok"],
        "errors": j["errors_by_status"],
        "ttft_ms_p50": j["ttft_ms"]["p50"],
        "ttft_ms_p95": j["ttft_ms"]["p95"],
        "itl_ms_p50": j["itl_ms"]["p50"],
        "itl_ms_p95": j["itl_ms"]["p95"],
        "tokens_per_s_per_stream_p50": j["output_tokens_per_s_per_stream"]["p50"],
        "output_tokens_per_s": j["output_tokens_per_s"],
    }


async def _at(url: str, model: str, streams: int, requests: int, prompt: int, answer: int) -> dict[str, Any]:
    """loadgen's summary of one closed-loop run at `streams` concurrent streams."""
    cfg = LoadConfig(
        base_url=f"{url}/v1", model=model, concurrency=streams, requests=requests,
        prompt_tokens=prompt, max_tokens=answer,
    )  # fmt: skip
    return _summary((await run_load(cfg)).to_json())


async def bench_enginesim(sup: Supervisor) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for streams in (1, 32, 64):
        proc, url = _enginesim(sup)
        try:
            out[str(streams)] = await _at(url, EIGHT_B, streams, streams, 256, 400)
        finally:
            sup.stop(proc)
    return out


async def bench_overhead(sup: Supervisor, streams: int = 200) -> dict[str, Any]:
    proc, url = _enginesim(sup, "--max-num-seqs", "256")
    try:
        itl_sum0 = _metric_sum(url, "vllm:inter_token_latency_seconds_sum")
        itl_cnt0 = _metric_sum(url, "vllm:inter_token_latency_seconds_count")
        cfg = LoadConfig(
            base_url=f"{url}/v1", model=EIGHT_B, concurrency=streams, requests=streams,
            prompt_tokens=128, max_tokens=200,
        )  # fmt: skip
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        report = await run_load(cfg)
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        engine_itl = (_metric_sum(url, "vllm:inter_token_latency_seconds_sum") - itl_sum0) / max(
            1.0, _metric_sum(url, "vllm:inter_token_latency_seconds_count") - itl_cnt0
        )
    finally:
        sup.stop(proc)
    gaps = [g for r in report.results for g in r.itls_s]
    chunks = sum(r.token_chunks for r in report.results)
    cpu_s = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    client_itl = sum(gaps) / len(gaps)
    return {
        "streams": streams,
        "loadgen": _summary(report.to_json()),
        "engine_mean_itl_ms": round(engine_itl * 1000, 3),
        "client_mean_itl_ms": round(client_itl * 1000, 3),
        "client_over_engine_itl": round(client_itl / engine_itl, 4),
        "loadgen_cpu_s": round(cpu_s, 3),
        "loadgen_cpu_us_per_chunk": round(cpu_s / chunks * 1e6, 2),
        "loadgen_cpu_share_of_wall": round(cpu_s / report.duration_s, 4),
        "chunks": chunks,
    }


async def bench_vllm(sup: Supervisor, work: Path, python: str) -> dict[str, Any]:
    model_dir = work / "tiny-llama"
    build = [python, str(REPO / "tools" / "build_tiny_llama.py"), str(model_dir)]
    await asyncio.to_thread(subprocess.run, build, check=True)
    for sub in ("tmpdir", "cache"):
        (work / sub).mkdir(exist_ok=True)
    env = dict(
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TMPDIR=str(work / "tmpdir"),
        VLLM_CACHE_ROOT=str(work / "cache"), HF_HOME=str(work / "cache" / "hf"),
        VLLM_HOST_IP="127.0.0.1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1",
    )  # fmt: skip
    port = free_port()
    argv = [
        "env", "-u", "VLLM_CPU_KVCACHE_SPACE", "--chdir", str(work),
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--served-model-name",
        "tiny", "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "1024", "--max-num-seqs", "8",
        "--enforce-eager", "--dtype", "float32", "--kv-cache-memory-bytes", "64M",
    ]  # fmt: skip
    proc = sup.start("vllm", argv, env)
    out: dict[str, Any] = {}
    try:
        sup.wait_http_ok(proc, f"http://127.0.0.1:{port}/health", 180)
        for streams in (1, 8):
            out[str(streams)] = await _at(f"http://127.0.0.1:{port}", "tiny", streams, streams * 3, 128, 200)
    finally:
        sup.stop(proc)
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="llmfleet-bench-") as tmp:
        work = Path(tmp)
        sup = Supervisor(work / "logs")
        try:
            result: dict[str, Any] = {
                "enginesim_8b": await bench_enginesim(sup),
                "loadgen_overhead": await bench_overhead(sup),
            }
            if not args.skip_vllm:
                result["vllm_cpu"] = await bench_vllm(sup, work, args.vllm_python)
        finally:
            sup.stop_all()
        return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--vllm-python", default="/var/cache/llmfleet/vllm-venv/bin/python")
    parser.add_argument("--skip-vllm", action="store_true")
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(main_async(args)), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
