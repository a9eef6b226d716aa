"""The engines under test: enginesim (always) and the real vLLM 0.32 on CPU (marked `realvllm`).

Both are started once per session as processes serving the model `tiny` with
`--max-model-len 2048 --max-num-seqs 8 --scheduling-policy priority` (the Deployments' policy: the
orchestrator passes each request's class as `priority`), `--enable-prompt-tokens-details` (usage
says how much of the prompt was cached) and vLLM's dev-mode routes (`VLLM_SERVER_DEV_MODE=1`,
enginesim `--dev-mode`: `/pause`, `/resume`), which the priority checks use to hold requests still
(`slots.py`). The real one needs the vLLM venv's python in
`LLMFLEET_VLLM_PYTHON` (see `tools/install-vllm.sh`); when it is missing or cannot `import vllm`
the stage is skipped loudly, or FAILS when `LLMFLEET_REQUIRE_REAL_VLLM=1` (CI).

`pooling_engine` is the same pair as pooling engines (`/v1/embeddings`), started once per session
when a test asks for it: the real vLLM with `--runner pooling --convert embed` (the tiny Llama as an
embedding model), enginesim with `--runner pooling --embedding-dim 128` (the model's hidden size).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.cli.procs import free_port
from tests.conformance.differences import ENGINE_TRAITS, EngineTraits
from tests.conformance.procs import ServerProcess, ServerStartError, log_tail

REPO = Path(__file__).resolve().parents[2]
MODEL = "tiny"
MAX_MODEL_LEN = 2048
MAX_NUM_SEQS = 8
# Start-up bounds (`ServerProcess.wait_ready`): no fixed deadline while the engine makes progress;
# it fails when it exits, shows no progress (log or CPU time) for the stall window, or at the cap.
ENGINESIM_STALL_S, ENGINESIM_CAP_S = 30.0, 120.0
VLLM_STALL_S = 180.0  # vLLM prints little while it loads and profiles, but uses CPU all along
VLLM_CAP_S = 1800.0  # a safety net: a real start takes 1-2 min on a quiet 2-core machine


class EngineUnderTest:
    def __init__(self, kind: str, url: str, process: ServerProcess) -> None:
        self.kind = kind
        self.url = url
        self.process = process
        self.model = MODEL
        self.max_model_len = MAX_MODEL_LEN
        self.traits: EngineTraits = ENGINE_TRAITS[kind]

    def __repr__(self) -> str:
        return f"<{self.kind} at {self.url}>"


def _start(
    name: str, argv: list[str], log_path: Path, port: int, stall_s: float, cap_s: float, **kw: object
) -> ServerProcess:
    proc = ServerProcess(name, argv, log_path, **kw)  # type: ignore[arg-type]
    proc.start()
    try:
        took = proc.wait_ready(f"http://127.0.0.1:{port}/health", stall_s=stall_s, cap_s=cap_s)
    except ServerStartError:
        proc.stop()
        raise
    print(f"\n{name} ready after {took:.0f} s", file=sys.stderr)
    return proc


def serve_enginesim(work: Path, *extra: str) -> Iterator[EngineUnderTest]:
    """enginesim as the suite runs it (`extra`: more CLI flags), stopped when the generator closes."""
    port = free_port()
    argv = [
        sys.executable, "-m", "apps.cli.main", "enginesim", "--model", MODEL, "--profile", "tiny",
        "--port", str(port), "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(MAX_NUM_SEQS),
        "--scheduling-policy", "priority", "--enable-prompt-tokens-details", "--dev-mode", *extra,
    ]  # fmt: skip
    proc = _start(
        "enginesim", argv, work / "enginesim.log", port, ENGINESIM_STALL_S, ENGINESIM_CAP_S, cwd=REPO
    )
    try:
        yield EngineUnderTest("enginesim", f"http://127.0.0.1:{port}", proc)
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def enginesim_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineUnderTest]:
    yield from serve_enginesim(tmp_path_factory.mktemp("enginesim"))


def _vllm_python() -> str:
    """The real vLLM's interpreter, or skip/fail loudly."""
    required = os.environ.get("LLMFLEET_REQUIRE_REAL_VLLM") == "1"
    python = os.environ.get("LLMFLEET_VLLM_PYTHON", "")
    how = "run `bash tools/install-vllm.sh /var/cache/llmfleet/vllm-venv` and set LLMFLEET_VLLM_PYTHON"
    reason = ""
    if not python:
        reason = "LLMFLEET_VLLM_PYTHON is not set"
    elif not Path(python).exists():
        reason = f"LLMFLEET_VLLM_PYTHON={python} does not exist"
    else:
        probe = subprocess.run([python, "-c", "import vllm"], capture_output=True, text=True, timeout=300)
        if probe.returncode != 0:
            reason = f"`import vllm` fails in {python}: {probe.stderr.strip().splitlines()[-1:]}"
    if reason:
        message = f"skipped: real vLLM not installed ({reason}); {how}"
        if required:
            pytest.fail(f"LLMFLEET_REQUIRE_REAL_VLLM=1 but real vLLM is not usable: {reason}; {how}")
        print(f"\n*** {message} ***", file=sys.stderr)
        pytest.skip(message)
    return python


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """(the real vLLM's python, the tiny model built once per session)."""
    python = _vllm_python()
    model_dir = tmp_path_factory.mktemp("tiny-llama") / "tiny-llama"
    build = subprocess.run(
        [python, str(REPO / "tools" / "build_tiny_llama.py"), str(model_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    if build.returncode != 0:
        pytest.fail(f"building the tiny model failed:\n{build.stdout[-2000:]}\n{build.stderr[-4000:]}")
    return python, model_dir


def serve_vllm(
    python: str,
    model_dir: Path,
    work: Path,
    kv_cache_bytes: str,
    max_model_len: int = MAX_MODEL_LEN,
    extra: tuple[str, ...] = (),
) -> Iterator[EngineUnderTest]:
    for sub in ("tmpdir", "cache"):
        (work / sub).mkdir()
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TMPDIR=str(work / "tmpdir"),
        VLLM_CACHE_ROOT=str(work / "cache"),
        HF_HOME=str(work / "cache" / "hf"),
        VLLM_HOST_IP="127.0.0.1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_SERVER_DEV_MODE="1",  # /pause and /resume (slots.py)
    )
    proc: ServerProcess | None = None
    last_error: Exception | None = None
    for attempt in range(3):  # a free port can be taken between probe and bind: retry on another
        port = free_port()
        argv = [
            python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port),
            "--max-model-len", str(max_model_len), "--max-num-seqs", str(MAX_NUM_SEQS),
            "--enforce-eager", "--dtype", "float32", "--kv-cache-memory-bytes", kv_cache_bytes,
            "--scheduling-policy", "priority", "--enable-prompt-tokens-details", *extra,
        ]  # fmt: skip
        log_path = work / f"vllm-{attempt}.log"
        try:
            proc = _start("vllm", argv, log_path, port, VLLM_STALL_S, VLLM_CAP_S, env=env, cwd=work)
            break
        except ServerStartError as exc:
            last_error = exc
            if "address already in use" not in log_tail(log_path, 200).lower():
                raise
    if proc is None:
        raise last_error or RuntimeError("vllm did not start")
    try:
        yield EngineUnderTest("vllm", f"http://127.0.0.1:{port}", proc)
    finally:
        proc.stop()
        shutil.rmtree(work / "tmpdir", ignore_errors=True)


@pytest.fixture(scope="session")
def vllm_server(
    tiny_llama: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineUnderTest]:
    python, model_dir = tiny_llama
    yield from serve_vllm(python, model_dir, tmp_path_factory.mktemp("vllm"), "64M")


@pytest.fixture(
    scope="session",
    # pytest-timeout counts fixture set-up: the test that starts the real vLLM may wait up to the
    # start-up cap on top of its own run time (the default per-test timeout is 120 s).
    params=[
        "enginesim",
        pytest.param("vllm", marks=[pytest.mark.realvllm, pytest.mark.timeout(VLLM_CAP_S + 120)]),
    ],
)
def engine(request: pytest.FixtureRequest) -> EngineUnderTest:
    server: EngineUnderTest = request.getfixturevalue(f"{request.param}_server")
    return server


# The pooling engines (`/v1/embeddings`): vLLM serves the same tiny Llama converted to an embedding
# model (`--runner pooling --convert embed`: last-token pooling, L2-normalised, one value per hidden
# unit); enginesim is started with `--runner pooling` and that length.
HIDDEN_SIZE = 128  # the tiny Llama's `hidden_size` (tools/build_tiny_llama.py)


@pytest.fixture(scope="session")
def enginesim_pooling_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineUnderTest]:
    yield from serve_enginesim(
        tmp_path_factory.mktemp("enginesim-pooling"),
        "--runner",
        "pooling",
        "--embedding-dim",
        str(HIDDEN_SIZE),
    )


@pytest.fixture(scope="session")
def vllm_pooling_server(
    tiny_llama: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineUnderTest]:
    python, model_dir = tiny_llama
    work = tmp_path_factory.mktemp("vllm-pooling")
    yield from serve_vllm(python, model_dir, work, "64M", extra=("--runner", "pooling", "--convert", "embed"))


@pytest.fixture(
    scope="session",
    params=[
        "enginesim",
        pytest.param("vllm", marks=[pytest.mark.realvllm, pytest.mark.timeout(VLLM_CAP_S + 120)]),
    ],
)
def pooling_engine(request: pytest.FixtureRequest) -> EngineUnderTest:
    """A pooling engine (`/v1/embeddings`), as `engine` is a generating one."""
    server: EngineUnderTest = request.getfixturevalue(f"{request.param}_pooling_server")
    return server


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    report = yield
    funcargs = getattr(item, "funcargs", {})
    engine = funcargs.get("engine") or funcargs.get("pooling_engine")
    if isinstance(engine, EngineUnderTest) and getattr(report, "failed", False):
        report.sections.append((f"{engine.kind} server log (tail)", log_tail(engine.process.log_path)))  # type: ignore[attr-defined]
    return report
