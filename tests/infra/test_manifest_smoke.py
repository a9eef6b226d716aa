"""Manifest-to-process smoke test (issue 13 item 1).

Builds the package the way the Dockerfiles do, installs it into a fresh venv outside the
checkout, and starts every platform container of the rendered prod stack (migrate Job,
orchestrator, gateway, the vLLM pod's agent and model-sync) with the exact command, args and
environment of its rendered object. Cluster services map to the local PostgreSQL, Redis, an
enginesim in vLLM's place and moto's S3 server. A runtime stage that lacks a file an entry
point reads (the stack specs) fails here.

Each container runs as its pod runs it (issue 26): as the rendered user (securityContext, else
the image's USER 10001), with the whole filesystem read-only (readOnlyRootFilesystem) except the
container's rendered read-write volume mounts, HOME pointing nowhere, cwd `/` and no capabilities
when it drops ALL. That needs root and mount namespaces (`unshare`, `setpriv`).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from apps.cli.procs import free_port
from apps.modelsync.publish import publish_model
from apps.modelsync.s3 import Boto3ObjectStore
from apps.modelsync.signing import KmsSigner
from infra.manifests.common import NAMESPACE
from tests.fakes.procs import stop_processes
from tests.infra.conftest import kube_objects
from tests.infra.smoke_env import (
    Cluster,
    build_image_venv,
    container_process,
    dockerfile_for,
    drops_all_capabilities,
    run_as,
    sandboxed,
    writable_mounts,
)

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

    def _prepare(
        self, spec: dict[str, Any], container: dict[str, Any], pod: str
    ) -> tuple[list[str], dict[str, str], Path]:
        env_dir, df = build_image_venv(dockerfile_for(container["image"]), self.workdir)
        argv, env = container_process(container, df, env_dir, self.cluster, pod)
        uid, gid = run_as(spec, container, df)
        argv, extra = sandboxed(
            argv, uid, gid, writable_mounts(container, self.cluster), drops_all_capabilities(container)
        )
        return argv, {**env, **extra}, self.workdir / f"{pod}-{container['name']}.log"

    def run_to_completion(
        self,
        spec: dict[str, Any],
        container: dict[str, Any],
        pod: str,
        extra: dict[str, str],
        ok: bool = True,
    ) -> str:
        """Run the container to its end; its output. `ok=False`: it must fail (the pod never starts)."""
        argv, env, log = self._prepare(spec, container, pod)
        done = subprocess.run(argv, env={**env, **extra}, cwd="/", capture_output=True, timeout=300)
        log.write_bytes(done.stdout + done.stderr)
        if ok:
            assert done.returncode == 0, (
                f"{pod}/{container['name']}: exit {done.returncode}\n{log.read_text()}"
            )
        else:
            assert done.returncode != 0, f"{pod}/{container['name']}: succeeded\n{log.read_text()}"
        return log.read_text()

    def start(self, spec: dict[str, Any], container: dict[str, Any], pod: str) -> None:
        argv, env, log = self._prepare(spec, container, pod)
        with log.open("wb") as out:  # the child keeps its own descriptor
            proc = subprocess.Popen(argv, env=env, cwd="/", stdout=out, stderr=subprocess.STDOUT)
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


@pytest.fixture
def workdir() -> Iterator[Path]:
    """Outside the checkout and traversable by the pods' user (pytest's own temp dirs are 0700)."""
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("setpriv")):
        pytest.skip("running containers as their pods do needs root, unshare and setpriv")
    path = Path(tempfile.mkdtemp(prefix="llmfleet-smoke-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _confined(argv: list[str], uid: int, writable: list[Path]) -> int:
    wrapped, extra = sandboxed(argv, uid, uid, writable)
    return subprocess.run(wrapped, env={**os.environ, **extra}, cwd="/", capture_output=True).returncode


def test_every_platform_container_starts_from_its_rendered_object(
    workdir: Path, fresh_db_url: str, redis_url: str, s3_endpoint: str
) -> None:
    kube = kube_objects(STACK)
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
    journal = cluster.mounts["/var/lib/llmfleet"]
    journal.chmod(0o777)  # an emptyDir; /models is a root-owned hostPath
    # The emulation itself: nothing but a read-write mount is writable, as user 10001 or root.
    touch = ["sh", "-c", 'touch "$1"', "touch"]
    assert _confined([*touch, str(workdir / "probe")], 10001, []) != 0
    assert _confined([*touch, "/tmp/llmfleet-smoke-probe"], 0, []) != 0
    assert _confined([*touch, str(journal / "probe")], 10001, [journal]) == 0
    pods = Pods(workdir, cluster)
    try:
        job = _obj(kube, "Job", "llmfleet-migrate")["spec"]["template"]["spec"]
        for container in [*job["initContainers"], *job["containers"]]:
            pods.run_to_completion(job, container, "llmfleet-migrate-x1", {})
        for app in ("orchestrator", "gateway"):
            spec = _obj(kube, "Deployment", app)["spec"]["template"]["spec"]
            pods.start(spec, spec["containers"][0], f"{app}-0")
        # A generate model's pod: enginesim stands in for its engine below (an embedding model's
        # engine keeps no KV cache, which enginesim's catalog profiles do not model).
        vllm_pod = next(
            o["spec"]["template"]["spec"]
            for o in kube
            if o["kind"] == "Deployment"
            and o["metadata"]["name"].startswith("vllm-")
            and "--runner" not in o["spec"]["template"]["spec"]["containers"][0]["args"]
        )
        sync = vllm_pod["initContainers"][0]
        bucket, model, revision = (
            sync["args"][sync["args"].index(f) + 1] for f in ("--bucket", "--model", "--revision")
        )
        moto: dict[str, Any] = {
            "endpoint_url": s3_endpoint,
            "region_name": "us-east-1",
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
        }
        s3 = boto3.client("s3", **moto)
        s3.create_bucket(Bucket=bucket)
        # The revision as `llmfleet model publish` leaves it: files, then the manifest signed by KMS.
        kms = boto3.client("kms", **moto)
        key = kms.create_key(KeyUsage="SIGN_VERIFY", KeySpec="ECC_NIST_P256")["KeyMetadata"]["Arn"]
        weights = workdir / "weights"
        weights.mkdir()
        (weights / "config.json").write_bytes(b"{}")
        publish_model(Boto3ObjectStore(s3), KmsSigner(kms, key), bucket, model, revision, weights, {})
        # The rendered env names the signing key (an output at apply time): here, moto's key.
        assert [e["name"] for e in sync["env"]] == ["LLMFLEET_MODEL_SIGNING_KEY"]
        aws = {
            "LLMFLEET_S3_ENDPOINT_URL": s3_endpoint,
            "LLMFLEET_MODEL_SIGNING_KEY": key,
            "AWS_ENDPOINT_URL_KMS": s3_endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        # A file the signed manifest does not list: refused in one line, nothing marked complete.
        s3.put_object(Bucket=bucket, Key=f"{model}/{revision}/extra.bin", Body=b"x")
        refused = pods.run_to_completion(vllm_pod, sync, "vllm-pod-0", aws, ok=False)
        assert "extra.bin is not in the signed manifest" in refused, refused
        assert not (cluster.mounts["/models"] / model / revision).exists()
        s3.delete_object(Bucket=bucket, Key=f"{model}/{revision}/extra.bin")
        pods.run_to_completion(vllm_pod, sync, "vllm-pod-0", aws)
        assert (cluster.mounts["/models"] / model / revision / "config.json").is_file()
        agent = next(c for c in vllm_pod["containers"] if c["name"] == "agent")
        seqs = agent["args"][agent["args"].index("--max-num-seqs") + 1]
        engine = _engine(model, seqs, ports[8000], workdir / "engine.log")
        pods.procs.append(engine)
        pods.start(
            vllm_pod, agent, "vllm-pod-0"
        )  # /readyz: registered with the orchestrator as eks/vllm-pod-0
    finally:
        pods.stop()
