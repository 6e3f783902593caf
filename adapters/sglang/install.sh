#!/usr/bin/env bash
# Install SGLang's CPU-usable wheel into a venv that already holds torch (the CPU
# build) and attnfuzz: install.sh VENV [RELEASE]. Without RELEASE, the default
# release (0.5.23). Every package goes in --no-deps from the pinned list of this
# directory: the wheel declares the CUDA build of torch and CUDA-only packages,
# which the metadata code attnfuzz drives never imports.
# Used by setup.sh (ATTNFUZZ_SGLANG=1 or =<release>) and benchmarks/releases.py.
set -euo pipefail
venv=$1
release=${2:-0.5.23}
here="$(cd "$(dirname "$0")" && pwd)"
pip=("$venv/bin/python" -m pip install --quiet --no-deps)

case "$release" in
    0.5.9 | 0.5.9.* | 0.5.1[0-9] | 0.5.1[0-9].* | 0.5.2[0-3] | 0.5.2[0-3].*) ;;
    *)
        echo "install.sh: SGLang $release is outside the supported releases 0.5.9 to 0.5.23" >&2
        exit 2
        ;;
esac
# 0.5.9 to 0.5.14 import with the transformers 0.5.11 to 0.5.13 declare (5.8.1), not
# 0.5.23's (0.5.9 and 0.5.10 declare 4.57.1 and 5.3.0; 5.8.1 imports them, and 0.5.14).
case "$release" in
    0.5.9 | 0.5.9.* | 0.5.1[0-4] | 0.5.1[0-4].*) pinned="$here/requirements-cpu-0.5.9-0.5.14.txt" ;;
    *) pinned="$here/requirements-cpu.txt" ;;
esac
"${pip[@]}" -r "$pinned" "sglang==$release"
"$venv/bin/python" -c "
from attnfuzz.adapters.sglang import _engine
_engine.configure_environment()
import sglang
print('sglang', sglang.__version__)"
