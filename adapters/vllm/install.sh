#!/usr/bin/env bash
# Install vLLM's CPU-usable wheel into a venv that already holds torch (the CPU
# build) and attnfuzz: install.sh VENV [RELEASE]. Without RELEASE, the default
# release of requirements-cpu.txt. Every package goes in --no-deps from the
# pinned lists of this directory: the wheel declares the CUDA build of torch and
# CUDA-only packages, which the metadata code attnfuzz drives never imports.
# Used by setup.sh (ATTNFUZZ_VLLM=1 or =<release>) and benchmarks/releases.py.
set -euo pipefail
venv=$1
release=${2:-}
here="$(cd "$(dirname "$0")" && pwd)"
pip=("$venv/bin/python" -m pip install --quiet --no-deps)

# The pinned list of each supported release range, on top of the default's.
extra=()
case "$release" in
    "") ;;
    0.21.* | 0.22.* | 0.23.*) extra=(-r "$here/requirements-cpu-0.21-0.23.txt") ;;
    0.2[4-9].* | 0.3[0-3].*) ;;
    *)
        echo "install.sh: vLLM $release is outside the supported releases 0.21.0 to 0.33.0" >&2
        exit 2
        ;;
esac
"${pip[@]}" -r "$here/requirements-cpu.txt"
if [ -n "$release" ]; then
    "${pip[@]}" "${extra[@]}" "vllm==$release"
fi
"$venv/bin/python" -c "import attnfuzz.adapters.vllm._engine, vllm; print('vllm', vllm.__version__)"
