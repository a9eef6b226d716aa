"""`llmfleet dev` as a new user runs it: start, stream from all three models with the
official `openai` SDK, see the four nodes in `GET /admin/nodes`, SIGTERM, and nothing is
left behind (every child pid gone, every port it listened on free again).

Embedded PostgreSQL and Redis (no URLs in the environment), as on a fresh laptop.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import openai
import psutil
import pytest

from apps.cli.platform_config import MODEL_EMBED
from apps.cli.procs import free_port
from tests.e2e.devproc import wait_credentials

pytestmark = pytest.mark.slow

MODELS = ("llama-3.1-8b-instruct", "qwen2.5-32b-instruct", "llama-3.3-70b-instruct-fp8")
STOP_DEADLINE_S = 60.0


def _descendants(pid: int) -> list[psutil.Process]:
    children: list[psutil.Process] = psutil.Process(pid).children(recursive=True)
    return children


def _listening_ports(procs: list[psutil.Process]) -> set[int]:
    pids = {p.pid for p in procs}
    return {
        c.laddr.port
        for c in psutil.net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.pid in pids and c.laddr
    }


def _port_free(port: int) -> bool:
    """Nothing listens there and a new server could bind it (as servers do, with SO_REUSEADDR:
    the TIME_WAIT entries of closed client connections do not count)."""
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", port)) == 0:
            return False
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_dev_serves_four_models_lists_five_nodes_and_stops_clean(tmp_path: Path) -> None:
    data_dir = tmp_path / "dev"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("LLMFLEET_DATABASE_URL", "LLMFLEET_REDIS_URL")}
    out = (tmp_path / "dev.out").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "apps.cli.main", "dev", "--data-dir", str(data_dir), "--port", str(port)],
        stdout=out,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        creds = wait_credentials(proc, data_dir / "credentials.env")
        assert set(creds) == {"OPENAI_BASE_URL", "OPENAI_API_KEY", "LLMFLEET_ADMIN_TOKEN"}
        assert creds["OPENAI_BASE_URL"] == f"http://127.0.0.1:{port}/v1"
        assert oct((data_dir / "credentials.env").stat().st_mode & 0o777) == "0o600"

        client = openai.OpenAI(
            base_url=creds["OPENAI_BASE_URL"], api_key=creds["OPENAI_API_KEY"], max_retries=0
        )
        for model in MODELS:
            stream = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "Say hello."}],
                max_tokens=8,
                stream=True,
                stream_options={"include_usage": True},
            )
            text, usage = [], None
            for chunk in stream:
                if chunk.choices:
                    text.append(chunk.choices[0].delta.content or "")
                if chunk.usage is not None:
                    usage = chunk.usage
            assert "".join(text).strip(), model
            assert usage is not None, model
            assert usage.completion_tokens == 8, model
        done = client.completions.create(model=MODELS[0], prompt="Say", max_tokens=4)
        assert done.usage is not None
        assert done.usage.completion_tokens == 4
        vectors = client.embeddings.create(model=MODEL_EMBED, input=["hello", "world"])
        assert [len(d.embedding) for d in vectors.data] == [1024, 1024]  # bge-m3's dimensions
        client.close()  # its pooled socket would otherwise be collected, with a warning, in a later test

        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/admin/nodes",
            headers={"Authorization": f"Bearer {creds['LLMFLEET_ADMIN_TOKEN']}"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            nodes = json.loads(resp.read())["data"]
        assert len(nodes) == 5
        assert {n["state"] for n in nodes} == {"ready"}
        by_model: dict[str, list[str]] = {}
        for n in nodes:
            for m in n["models"]:
                by_model.setdefault(m, []).append(n["location"])
        assert sorted(by_model["llama-3.1-8b-instruct"]) == ["cloud", "onprem"]
        assert by_model["qwen2.5-32b-instruct"] == ["cloud"]
        assert by_model["llama-3.3-70b-instruct-fp8"] == ["cloud"]
        assert by_model[MODEL_EMBED] == ["cloud"]

        children = _descendants(proc.pid)
        pg_pid = int((data_dir / "pg" / "postmaster.pid").read_text().split()[0])
        children.append(psutil.Process(pg_pid))  # pg_ctl daemonizes it: not our descendant
        ports = _listening_ports(children) | {port}
        assert port in ports
        assert len(ports) >= 1 + 1 + 5  # gateway, orchestrator, engines (at least)

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=STOP_DEADLINE_S) == 0
        _, alive = psutil.wait_procs(children, timeout=10)
        assert alive == [], f"left behind: {[p.pid for p in alive]}"
        assert [p for p in ports if not _port_free(p)] == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        out.close()
