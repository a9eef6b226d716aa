"""Real vLLM engines as local platform nodes (the tiny random-weight Llama on the CPU), for the
benchmarks that compare a policy on the real engine too (`prefix --engine vllm`).

The engine is the one the conformance stage runs (`tools/install-vllm.sh`, `tools/build_tiny_llama.py`):
vLLM 0.32 on the CPU, float32, `--enforce-eager`, its KV cache given in bytes, publishing its KV cache
events where the local platform's agent subscribes. Its timings are a CPU's, not a GPU's: what
carries over is the ratio between two policies measured side by side, and the hit rate.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from apps.cli.platform import NodeSpec

DEFAULT_PYTHON = "/var/cache/llmfleet/vllm-venv/bin/python"
DEFAULT_MODEL_DIR = Path("/var/cache/llmfleet/tiny-llama")
CPU_BLOCK_TOKENS = 128  # vLLM 0.32's block size on the CPU backend
TINY_KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 32 * 4  # K and V, 2 layers, 2 KV heads, head_dim 32, float32
MAX_MODEL_LEN = 2048
MAX_NUM_SEQS = 8
OFFLINE = (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"))


def vllm_python() -> str:
    python = os.environ.get("LLMFLEET_VLLM_PYTHON", DEFAULT_PYTHON)
    if not Path(python).exists():
        raise SystemExit(
            f"no vLLM at {python}: run `bash tools/install-vllm.sh /var/cache/llmfleet/vllm-venv`"
        )
    return python


def tiny_model(python: str, model_dir: Path = DEFAULT_MODEL_DIR) -> Path:
    """The tiny model, built once (the builder leaves a complete build alone)."""
    builder = Path(__file__).resolve().parents[1] / "build_tiny_llama.py"
    subprocess.run([python, str(builder), str(model_dir)], check=True, env={**os.environ, **dict(OFFLINE)})
    return model_dir


def vllm_node(node_id: str, model: str, python: str, model_dir: Path, work: Path, kv_tokens: int) -> NodeSpec:
    """A node whose engine is a real vLLM serving the tiny model as `model`, with a KV cache of
    `kv_tokens` tokens, at least `MAX_MODEL_LEN` (one CPU block more: vLLM keeps one back)."""
    (work / node_id / "tmp").mkdir(parents=True, exist_ok=True)
    # vLLM refuses to start with a KV cache that cannot hold one sequence of `--max-model-len` tokens.
    kv_bytes = (max(kv_tokens, MAX_MODEL_LEN) + CPU_BLOCK_TOKENS) * TINY_KV_BYTES_PER_TOKEN
    command = (
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", model, "--host", "127.0.0.1", "--port", "{port}",
        "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(MAX_NUM_SEQS),
        "--enforce-eager", "--dtype", "float32", "--kv-cache-memory-bytes", str(kv_bytes),
        "--scheduling-policy", "priority", "--enable-prompt-tokens-details",
        "--kv-events-config", "{kv_events_config}",
    )  # fmt: skip
    env = (
        *OFFLINE,
        ("TMPDIR", str(work / node_id / "tmp")),
        ("VLLM_CACHE_ROOT", str(work / node_id / "cache")),
        ("VLLM_HOST_IP", "127.0.0.1"),
        ("VLLM_NO_USAGE_STATS", "1"),
        ("DO_NOT_TRACK", "1"),
    )
    return NodeSpec(
        node_id, model, "cloud", max_num_seqs=MAX_NUM_SEQS, engine_command=command, engine_env=env
    )
