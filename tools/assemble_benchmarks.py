"""Write docs/benchmarks.md: a short index, then every docs/bench/*.md section as the tools last wrote it.

.venv/bin/python tools/assemble_benchmarks.py
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ORDER = ["engine", "gateway", "platform", "hotpath"]
HEADER = """# Benchmarks

Every number here was measured on this project's development machine (2 vCPU x86_64, 24 GiB, Debian 12,
Python 3.11, PostgreSQL 15 and Redis 7 on loopback) by a tool in `tools/`, which prints its method. The machine is
shared and noisy: compare numbers measured side by side in one run (ratios), not across runs. Each section names its
date. To refresh: run the section's tool, then `.venv/bin/python tools/assemble_benchmarks.py`.

| section | tool | what it measures |
|---|---|---|
| [Engine simulator and loadgen](#engine) | `tools/bench_engine.py` | enginesim 8B profile at 1/32/64 streams vs the brief; loadgen overhead at 200 streams; a real vLLM on CPU at 1 and 8 streams |
| [Gateway overhead](#gateway) | `tools/bench_gateway.py` | added TTFT and CPU per 1,000 relayed tokens of the gateway alone at 200 streams (`tools/bench_dispatch.py`: the upstream client alone) |
| [Platform overhead](#platform) | `tools/bench_platform.py` | direct to enginesim vs gateway → orchestrator → agent → enginesim at 200 and 1,000 streams, burst and steady arrivals: added TTFT and per-request transit |
| [Relay hot path](#hotpath) | `tools/bench_hotpath.py` | CPU per relayed token per process, before/after the hot-path work; `tools/bench_settle.py`: one ledger settle |
"""


def main() -> None:
    parts = [HEADER]
    for name in ORDER:
        path = ROOT / "docs" / "bench" / f"{name}.md"
        text = path.read_text(encoding="utf-8").strip()
        # Shift the section's headings so that its top level sits one below this page's title.
        levels = [len(line) - len(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")]
        shift = "#" * (2 - min(levels, default=2))
        lines = [(shift + line) if line.startswith("#") else line for line in text.splitlines()]
        parts.append(f'<a id="{name}"></a>\n\n' + "\n".join(lines))
    (ROOT / "docs" / "benchmarks.md").write_text("\n\n".join(parts) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
