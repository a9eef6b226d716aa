"""GPU telemetry for heartbeats: utilisation from a DCGM exporter or `nvidia-smi`.

When neither is available `gpu_util` is absent from the heartbeat: a missing reading is
reported as missing, never faked as 0 or 1.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from typing import Protocol

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger("llmfleet.agent.telemetry")

_SMI_TIMEOUT_S = 5.0


class GpuProbe(Protocol):
    async def utilization(self) -> float | None:
        """Mean utilisation of this node's GPUs in [0, 1], or None when unknown."""
        ...

    async def count(self) -> int | None:
        """Number of GPUs, or None when unknown."""
        ...


class NoGpuProbe:
    async def utilization(self) -> float | None:
        return None

    async def count(self) -> int | None:
        return None


def parse_dcgm(text: str) -> tuple[float | None, int]:
    """(mean utilisation in [0, 1], GPU count) from dcgm-exporter text.

    `DCGM_FI_DEV_GPU_UTIL` is a percentage (0-100) per GPU (dcgm-exporter `etc/default-counters.csv`).
    """
    values: list[float] = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "DCGM_FI_DEV_GPU_UTIL":
                values.append(sample.value)
    if not values:
        return None, 0
    return min(1.0, max(0.0, sum(values) / len(values) / 100.0)), len(values)


def parse_nvidia_smi(text: str) -> list[float]:
    """Per-GPU utilisation (0-100) from `nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits`."""
    values: list[float] = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            values.append(float(line))
        except ValueError:
            continue  # "[N/A]" on GPUs that do not report it
    return values


class DcgmProbe:
    def __init__(self, session: aiohttp.ClientSession, url: str, timeout_s: float = 3.0) -> None:
        self._session = session
        self._url = url
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def _scrape(self) -> tuple[float | None, int]:
        try:
            async with self._session.get(self._url, timeout=self._timeout) as resp:
                if resp.status != 200:
                    return None, 0
                return parse_dcgm(await resp.text())
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None, 0

    async def utilization(self) -> float | None:
        return (await self._scrape())[0]

    async def count(self) -> int | None:
        n = (await self._scrape())[1]
        return n or None


class NvidiaSmiProbe:
    def __init__(self, executable: str) -> None:
        self._exe = executable

    async def _query(self) -> list[float] | None:
        try:
            proc = await asyncio.create_subprocess_exec(
                self._exe,
                "--query-gpu=utilization.gpu",
                "--format=csv,noheader,nounits",
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
            )
        except OSError:
            return None
        try:
            async with asyncio.timeout(_SMI_TIMEOUT_S):
                out, _ = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return None
        if proc.returncode != 0:
            return None
        return parse_nvidia_smi(out.decode(errors="replace"))

    async def utilization(self) -> float | None:
        values = await self._query()
        if not values:
            return None
        return min(1.0, max(0.0, sum(values) / len(values) / 100.0))

    async def count(self) -> int | None:
        values = await self._query()
        return len(values) if values is not None else None


def choose_gpu_probe(session: aiohttp.ClientSession, dcgm_url: str | None, nvidia_smi: str) -> GpuProbe:
    if dcgm_url:
        return DcgmProbe(session, dcgm_url)
    exe = shutil.which(nvidia_smi)
    if exe:
        return NvidiaSmiProbe(exe)
    log.info("no GPU telemetry (no DCGM exporter URL, no nvidia-smi): gpu_util will be absent")
    return NoGpuProbe()
