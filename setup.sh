#!/usr/bin/env bash
# Set up attnfuzz in ./.venv on a fresh Linux machine; safe to run again.
#
# torch is installed first and pinned, so that the project's own `torch>=2.4`
# is already satisfied: on a machine without a GPU, `torch==2.13.0` is the CPU
# build, and nothing pulls the multi-GB CUDA build in behind it.
set -euo pipefail
cd "$(dirname "$0")"

PYTHON="${PYTHON:-python3}"

# System programs some tests drive: redis-server (a shared example database
# for campaigns on several machines) and headless chromium (renders the HTML
# report). Installed with Debian's packages when missing and we may; skipped
# with ATTNFUZZ_NO_APT=1. Without them those tests skip, saying why.
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v chromium >/dev/null 2>&1 || missing+=(chromium fonts-dejavu-core)
if [ "${#missing[@]}" -gt 0 ] && [ -z "${ATTNFUZZ_NO_APT:-}" ] \
    && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
TORCH_SPEC="${ATTNFUZZ_TORCH:-torch==2.13.0}"

if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "$TORCH_SPEC"
# setuptools warns on every editable install that a folder named like the package
# could shadow it; none is (the checkout's root is the package), so not a word of it.
PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install --quiet -e '.[test]'

# Opt-in: vLLM 0.33.0 itself, the engine under test of `--impl vllm` (README,
# "Fuzzing vLLM itself"). Its wheel declares torch==2.14.0 (the CUDA build here)
# and CUDA-only packages, so it goes in without them: the pinned list holds the
# wheel and only what importing its metadata code needs, installed --no-deps.
# ATTNFUZZ_VLLM=1: the default release; ATTNFUZZ_VLLM=0.22.1 (a release from
# 0.21.0 to 0.33.0): that one instead, with its range's pinned list
# (adapters/vllm/install.sh).
if [ -n "${ATTNFUZZ_VLLM:-}" ] && [ "${ATTNFUZZ_VLLM}" != 0 ]; then
    release="${ATTNFUZZ_VLLM}"
    [ "$release" = 1 ] && release=""
    adapters/vllm/install.sh .venv $release
fi
# Opt-in: SGLang 0.5.23, the engine under test of `--impl sglang-*` (README,
# "Fuzzing SGLang itself"), the same way: its wheel and a pinned list, --no-deps
# (adapters/sglang/install.sh). ATTNFUZZ_SGLANG=1: the default release;
# ATTNFUZZ_SGLANG=0.5.12 (a release from 0.5.9 to 0.5.23): that one instead. Its
# pins agree with vLLM's, so both engines can share the venv.
if [ -n "${ATTNFUZZ_SGLANG:-}" ] && [ "${ATTNFUZZ_SGLANG}" != 0 ]; then
    release="${ATTNFUZZ_SGLANG}"
    [ "$release" = 1 ] && release=""
    adapters/sglang/install.sh .venv $release
fi
.venv/bin/python -c "import attnfuzz, torch, triton; print('attnfuzz', attnfuzz.__version__, '| torch', torch.__version__, '| triton', triton.__version__)"
