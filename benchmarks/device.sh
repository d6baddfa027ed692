#!/usr/bin/env bash
# Device plumbing: the one script for running benchmarks on a lent GPU machine.
#
# Sourced, from the repository root on the GPU machine: the environment every benchmark there needs.
#   export MEGAMOE_COMMIT=<commit the tree was copied from> MEGAMOE_DIRTY=0; source benchmarks/device.sh
#     The copied tree's .git may be stale (it would name the wrong commit), so it is moved aside and
#     rows take MEGAMOE_COMMIT (kernels.bench.git_state); the package is reached as megamoe.* through
#     symlinks in /tmp/site (on PYTHONPATH; the checkout's root is not), without pip install; simpy, which the GPU image lacks, comes as a wheel
#     in .whl/ (carried with the tree).
#
# Run: a list of steps in one device call, each under its own time limit, packing what they wrote
# into OUT/all.tgz after every step (a call cut short still returns the finished steps; the device
# returns a limited number of files, so everything travels as one archive).
#   bash benchmarks/device.sh OUT STEPS_FILE [TOTAL_S]
#     STEPS_FILE: one step per line, "NAME LIMIT_S COMMAND...", '#' starts a comment. A command writes
#     under $W (its own folder, ROOT/NAME); its stdout and stderr go to $W/log.txt. A step starts only
#     while its limit fits in what is left of TOTAL_S (default 570); one whose limit no longer fits gets
#     what is left, if that is at least 20 s. STEPS_ROOT: the folder the steps write under (default a
#     fresh /tmp/steps.XXXXXX), packed as it is.
#   A step such as `validate 560 benchmarks/gpu_validate.sh $W 540` runs the calibrate-then-validate job.

if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then
    set -o pipefail
    export PYTHONUNBUFFERED=1
    if [ -z "${MEGAMOE_COMMIT:-}" ]; then echo "device.sh: set MEGAMOE_COMMIT first" >&2; return 2; fi
    mv .git /tmp/git.stale 2>/dev/null || true
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    for d in reference simulator kernels; do ln -sfn ../$d megamoe/$d; done
    # megamoe is reached through /tmp/site, never through the checkout's root on sys.path (its folders
    # would shadow installed distributions by their bare names; tests/conftest.py takes the root off)
    ln -sfn "$PWD/megamoe" /tmp/site/megamoe
    export PYTHONPATH=/tmp/site
    return 0
fi

set -u -o pipefail
OUT=${1:?usage: device.sh OUT STEPS_FILE [TOTAL_S]  (or: source benchmarks/device.sh)}
STEPS=${2:?usage: device.sh OUT STEPS_FILE [TOTAL_S]}
TOTAL=${3:-570}
ROOT=${STEPS_ROOT:-$(mktemp -d /tmp/steps.XXXXXX)}
mkdir -p "$OUT" "$ROOT"
START=$(date +%s)
cp "$STEPS" "$ROOT/steps.txt"
pack() { tar czf "$OUT/all.tgz.part" -C "$ROOT" . && mv "$OUT/all.tgz.part" "$OUT/all.tgz"; }
while read -r name limit cmd; do
    case "$name" in ''|'#'*) continue ;; esac
    left=$(( TOTAL - $(date +%s) + START ))
    if [ "$limit" -gt "$left" ]; then
        limit=$(( left - 5 ))
        if [ "$limit" -lt 20 ]; then echo "[steps] $name: ${left} s left, not started" | tee -a "$ROOT/driver.log"; continue; fi
    fi
    export W="$ROOT/$name"
    mkdir -p "$W"
    t0=$(date +%s)
    echo "[steps $(( t0 - START )) s] $name (limit $limit s): $cmd" | tee -a "$ROOT/driver.log"
    timeout -k 10 "$limit" bash -c "$cmd" > "$W/log.txt" 2>&1 < /dev/null
    rc=$?
    echo "[steps $(( $(date +%s) - START )) s] $name: exit $rc after $(( $(date +%s) - t0 )) s" | tee -a "$ROOT/driver.log"
    tail -n 15 "$W/log.txt"
    pack
done < "$STEPS"
pack
