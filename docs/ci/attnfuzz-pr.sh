#!/usr/bin/env bash
# attnfuzz in an engine repository's CI: fuzz the pull request's checkout.
#
#   attnfuzz-pr.sh install    # attnfuzz into the engine's environment, torch and engine left alone
#   attnfuzz-pr.sh campaign   # attnfuzz list (which tree, which commit), then the campaign
#   attnfuzz-pr.sh summary    # summary.md into the job summary ($GITHUB_STEP_SUMMARY)
#   attnfuzz-pr.sh gate       # the job's verdict: fail on a new finding, not on a known one
#
# Settings (environment):
#   ATTNFUZZ_SOURCE  what to pip install: a path, a wheel, or git+URL@TAG (required by install)
#   ATTNFUZZ_IMPLS   the engine's implementations to fuzz (default: vllm)
#   ATTNFUZZ_ARGS    more campaign options (default: --budget 10m -n auto)
#   ATTNFUZZ_OUT     the campaign's directory (default: attnfuzz-out)
#   ATTNFUZZ_KNOWN   a campaign.json committed in the repository: its findings are known and
#                    triaged, and fail no job (default: .attnfuzz/known/campaign.json, if present)
#   PYTHON           the environment's python (default: python)
set -uo pipefail

PYTHON="${PYTHON:-python}"
OUT="${ATTNFUZZ_OUT:-attnfuzz-out}"
KNOWN="${ATTNFUZZ_KNOWN:-.attnfuzz/known/campaign.json}"
attnfuzz() { "$PYTHON" -m attnfuzz.harness.cli "$@"; }

case "${1:-}" in
install)
    : "${ATTNFUZZ_SOURCE:?names what to install: a path, a wheel or git+URL@TAG}"
    # No --upgrade: an installed torch or engine satisfies attnfuzz's floors and stays.
    "$PYTHON" -m pip install "$ATTNFUZZ_SOURCE"
    ;;
campaign)
    attnfuzz list | grep -E "installed|not installed" || true
    # shellcheck disable=SC2086 # ATTNFUZZ_ARGS is a list of options
    attnfuzz campaign --impls ${ATTNFUZZ_IMPLS:-vllm} ${ATTNFUZZ_ARGS:---budget 10m -n auto} \
        --quiet --out "$OUT"
    status=$?
    mkdir -p "$OUT" && echo "$status" >"$OUT/exit-status"  # the gate's, once reports are out
    ;;
summary)
    target="${GITHUB_STEP_SUMMARY:-/dev/stdout}"
    if [ -f "$OUT/summary.md" ]; then cat "$OUT/summary.md" >>"$target"
    else echo "attnfuzz wrote no summary: the campaign did not run." >>"$target"; fi
    ;;
gate)
    [ -f "$OUT/campaign.json" ] || { echo "attnfuzz: no campaign.json in $OUT" >&2; exit 3; }
    if [ -f "$KNOWN" ]; then
        # 1 on a finding the known campaign lacks; 3 when a run has no verdict; else 0.
        attnfuzz report --baseline "$KNOWN" --current "$OUT" --out "$OUT/regression"
        exit $?
    fi
    exit "$(cat "$OUT/exit-status")"  # nothing is known yet: every finding is new
    ;;
*)
    echo "usage: $0 install|campaign|summary|gate" >&2
    exit 2
    ;;
esac
