#!/usr/bin/env bash
# Set up attnfuzz in ./.venv on a fresh Linux machine; safe to run again.
#
# torch is installed first and pinned, so that the project's own `torch>=2.4`
# is already satisfied: on a machine without a GPU, `torch==2.13.0` is the CPU
# build, and nothing pulls the multi-GB CUDA build in behind it.
set -euo pipefail
cd "$(dirname "$0")"

PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${ATTNFUZZ_TORCH:-torch==2.13.0}"

if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "$TORCH_SPEC"
.venv/bin/python -m pip install --quiet -e '.[test]'
.venv/bin/python -c "import attnfuzz, torch, triton; print('attnfuzz', attnfuzz.__version__, '| torch', torch.__version__, '| triton', triton.__version__)"
