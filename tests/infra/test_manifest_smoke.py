"""Manifest-to-process smoke test (issue 13 item 1).

Builds the package the way the Dockerfiles do, installs it into a fresh venv outside the
checkout, and starts every platform container of the rendered prod stack (migrate Job,
orchestrator, gateway, the vLLM pod's agent and model-sync) with the exact command, args and
environment of its rendered object. Cluster services map to the local PostgreSQL, Redis, an
enginesim in vLLM's place and moto's S3 server. A runtime stage that lacks a file an entry
point reads (the stack specs) fails here.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from apps.cli.procs import free_port
from infra.manifests.common import NAMESPACE
from tests.fakes.procs import stop_processes
from tests.infra.conftest import kube_objects
from tests.infra.smoke_env import Cluster, build_image_venv, container_process, dockerfile_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
STACK = "prod"
READY_DEADLINE_S = 90.0


def _obj(kube: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in kube if o["kind"] == kind and o["metadata"]["name"] == name)


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + READY_DEADLINE_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{url}: exited {proc.returncode}\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} not ready within {READY_DEADLINE_S} s\n{log.read_text()[-3000:]}")


def _probe_url(container: dict[str, Any], cluster: Cluster) -> str:
    probe = container["readinessProbe"]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    port = probe["port"] if isinstance(probe["port"], int) else ports[probe["port"]]
    return f"http://127.0.0.1:{cluster.ports[port]}{probe['path']}"


class Pods:
    def __init__(self, workdir: Path, cluster: Cluster) -> None:
        self.workdir = workdir
        self.cluster = cluster
        self.procs: list[subprocess.Popen[bytes]] = []

    def _prepare(self, container: dict[str, Any], pod: str) -> tuple[list[str], dict[str, str], Path]:
        env_dir, df = build_image_venv(dockerfile_for(container["image"]), self.workdir)
        argv, env = container_process(container, df, env_dir, self.cluster, pod)
        return argv, env, self.workdir / f"{pod}-{container['name']}.log"

    def run_to_completion(self, container: dict[str, Any], pod: str, extra: dict[str, str]) -> None:
        argv, env, log = self._prepare(container, pod)
        cwd = self.workdir / "cwd"
        cwd.mkdir(exist_ok=True)
        done = subprocess.run(argv, env={**env, **extra}, cwd=cwd, capture_output=True, timeout=300)
        log.write_bytes(done.stdout + done.stderr)
        assert done.returncode == 0, f"{pod}/{container['name']}: exit {done.returncode}\n{log.read_text()}"

    def start(self, container: dict[str, Any], pod: str) -> None:
        argv, env, log = self._prepare(container, pod)
        cwd = self.workdir / "cwd"
        cwd.mkdir(exist_ok=True)
        with log.open("wb") as out:  # the child keeps its own descriptor
            proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        _wait_ready(proc, _probe_url(container, self.cluster), log)

    def stop(self) -> None:
        stop_processes(self.procs[::-1], 30)


@pytest.fixture
def s3_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def _engine(model: str, max_num_seqs: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    """enginesim in vLLM's place, from the checkout (it is the test's stand-in, not a shipped image)."""
    argv = [sys.executable, "-m", "apps.cli.main", "enginesim", "--model", model, "--stack", STACK]
    argv += ["--port", str(port), "--max-num-seqs", max_num_seqs, "--speed", "10"]
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)


def test_every_platform_container_starts_from_its_rendered_object(
    tmp_path_factory: pytest.TempPathFactory, fresh_db_url: str, redis_url: str, s3_endpoint: str
) -> None:
    kube = kube_objects(STACK)
    workdir = tmp_path_factory.mktemp("smoke")
    assert not str(workdir).startswith(str(Path(__file__).resolve().parents[2]))
    ports = {port: free_port() for port in (8080, 8081, 8082, 8083, 8084, 8090, 8000)}
    cluster = Cluster(
        secrets={
            "llmfleet-app": {
                "LLMFLEET_DATABASE_URL": fresh_db_url,
                "LLMFLEET_REDIS_URL": redis_url,
                "LLMFLEET_INTERNAL_TOKEN": secrets.token_hex(24),
                "LLMFLEET_SECRET_KEY": secrets.token_hex(32),
            },
            "llmfleet-cloud-node-token": {"token": secrets.token_hex(24)},
        },
        hosts={
            f"orchestrator.{NAMESPACE}.svc:8081": f"127.0.0.1:{ports[8081]}",
            f"orchestrator.{NAMESPACE}.svc:8082": f"127.0.0.1:{ports[8082]}",
            "127.0.0.1:8000": f"127.0.0.1:{ports[8000]}",
        },
        ports=ports,
        mounts={"/models": workdir / "models", "/var/lib/llmfleet": workdir / "journal"},
    )
    for d in cluster.mounts.values():
        d.mkdir()
    pods = Pods(workdir, cluster)
    try:
        job = _obj(kube, "Job", "llmfleet-migrate")["spec"]["template"]["spec"]
        for container in [*job["initContainers"], *job["containers"]]:
            pods.run_to_completion(container, "llmfleet-migrate-x1", {})
        for app in ("orchestrator", "gateway"):
            pods.start(_obj(kube, "Deployment", app)["spec"]["template"]["spec"]["containers"][0], f"{app}-0")
        vllm_pod = next(
            o["spec"]["template"]["spec"]
            for o in kube
            if o["kind"] == "Deployment" and o["metadata"]["name"].startswith("vllm-")
        )
        sync = vllm_pod["initContainers"][0]
        bucket, model, revision = (
            sync["args"][sync["args"].index(f) + 1] for f in ("--bucket", "--model", "--revision")
        )
        s3 = boto3.client(
            "s3",
            endpoint_url=s3_endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        s3.create_bucket(Bucket=bucket)
        s3.put_object(Bucket=bucket, Key=f"{model}/{revision}/config.json", Body=b"{}")
        aws = {
            "LLMFLEET_S3_ENDPOINT_URL": s3_endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        pods.run_to_completion(sync, "vllm-pod-0", aws)
        assert (cluster.mounts["/models"] / model / revision / "config.json").is_file()
        agent = next(c for c in vllm_pod["containers"] if c["name"] == "agent")
        seqs = agent["args"][agent["args"].index("--max-num-seqs") + 1]
        engine = _engine(model, seqs, ports[8000], workdir / "engine.log")
        pods.procs.append(engine)
        pods.start(agent, "vllm-pod-0")  # /readyz: registered with the orchestrator as eks/vllm-pod-0
    finally:
        pods.stop()
