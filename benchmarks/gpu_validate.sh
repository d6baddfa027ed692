#!/usr/bin/env bash
# Calibrate, then validate, on one GPU in one call: everything goes under OUT.
#
#   benchmarks/gpu_validate.sh OUT [TOTAL_SECONDS]        (from the repository root; default 480)
#
# 1. preflight: versions, the GPU, the imports the run needs (fails in seconds, not minutes)
# 2. megamoe calibrate --out OUT/calibrate --budget 150: microbenchmarks only -> profile.json
#    (rewritten after each step: a calibration cut short still leaves the steps it measured)
# 3. megamoe validate --profile OUT/calibrate/profile.json --compare-profiles h200 --out OUT/validate
#    --budget <what is left>: the default 108 configurations, each predicted from the calibrated
#    profile and from h200 as written (rows written) before it is measured; compile-ahead first
# 4. if validate stopped early (lost CUDA context: exit 3; watchdog: exit 4; killed by the outer
#    timeout), `--resume` in a fresh process while at least 60 s are left; then the report from
#    every row (validate writes it itself unless it was killed)
# OUT/driver.log says what ran, its exit code and its seconds.
# It leaves about 13 files under OUT: on a device tool that returns a limited number of files, run it
# as a step of benchmarks/device.sh (one archive). TOTAL_SECONDS must cover calibrate (about 60 s),
# the compile-ahead of every configuration's kernels (about 75 s on a machine whose Triton cache is
# cold) and the 108 measurements (about 45 s): 320 s leaves room.
#
# Environment: PYTHON (default python3) with the package importable (pip install, or
# `source benchmarks/device.sh` on a copied tree); MEGAMOE_COMMIT
# (and MEGAMOE_DIRTY, MEGAMOE_DIFF_SHA256) for the rows' provenance on a copied tree;
# TRITON_CACHE_DIR (default .triton-cache in the repository, ignored by git, so a second call on a
# machine that stayed warm compiles nothing); CALIBRATE_BUDGET (default 150); VALIDATE_ARGS and
# CALIBRATE_ARGS: more options, word-split (e.g. VALIDATE_ARGS="--models qwen3-30b-a3b --reps 10").
# GPU_VALIDATE_SMOKE=1: no GPU needed, a tiny interpreted run of the same steps (tests this script).
set -u -o pipefail

OUT=${1:?usage: benchmarks/gpu_validate.sh OUT [TOTAL_SECONDS]}
TOTAL=${2:-480}
PY=${PYTHON:-python3}
CAL_BUDGET=${CALIBRATE_BUDGET:-150}
SMOKE=${GPU_VALIDATE_SMOKE:-0}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$PWD/.triton-cache}
mkdir -p "$TRITON_CACHE_DIR"
START=$(date +%s)
MIN_TOTAL=300  # the three parts above, with a margin

elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( TOTAL - $(date +%s) + START )); }
log() { echo "[gpu_validate $(printf '%4d' "$(elapsed)") s] $*" | tee -a "$OUT/driver.log" >&2; }
# run NAME LIMIT_S CMD...: CMD with a hard limit, its output in OUT/NAME.log (appended) and here
run() {
    local name=$1 limit=$2 t0 rc
    shift 2
    t0=$(date +%s)
    log "$name: $* (hard limit ${limit} s)"
    timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$OUT/$name.log"
    rc=${PIPESTATUS[0]}
    log "$name: exit $rc after $(( $(date +%s) - t0 )) s"
    return "$rc"
}

if [ -n "${MEGAMOE_COMMIT:-}" ] && ! [[ "$MEGAMOE_COMMIT" =~ ^[0-9a-f]{7,40}$ ]]; then
    log "MEGAMOE_COMMIT=$MEGAMOE_COMMIT is not a commit id: unset (rows record commit 'unknown' or the tree's git)"
    unset MEGAMOE_COMMIT MEGAMOE_DIRTY MEGAMOE_DIFF_SHA256
fi

# 1. preflight
log "start: OUT=$OUT, total ${TOTAL} s, python $PY, TRITON_CACHE_DIR=$TRITON_CACHE_DIR"
if [ "$SMOKE" != 1 ] && [ "$TOTAL" -lt "$MIN_TOTAL" ]; then
    log "warning: ${TOTAL} s may not cover calibrate, the compile-ahead and 108 configurations (${MIN_TOTAL} s or more)"
fi
if ! "$PY" - "$SMOKE" > "$OUT/preflight.txt" 2>&1 <<'EOF'
import importlib, os, sys
smoke = sys.argv[1] == "1"
for mod in ("numpy", "torch", "triton", "simpy", "networkx", "numba", "matplotlib", "megamoe",
            "megamoe.reference", "megamoe.simulator", "megamoe.kernels.moe", "megamoe.kernels.megakernel",
            "megamoe.calibrate.microbench", "megamoe.measure", "megamoe.warm"):
    m = importlib.import_module(mod)
    print(mod, getattr(m, "__version__", ""), getattr(m, "__file__", ""))
import torch
print("cuda", torch.cuda.is_available(), torch.version.cuda, os.cpu_count(), "cpus")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info()
    print(f"gpu {p.name}, {p.multi_processor_count} SMs, {total / 2**30:.0f} GiB ({free / 2**30:.0f} free)")
elif not smoke:
    sys.exit("no CUDA GPU")
from megamoe.kernels.bench import git_state
print("code", git_state())
EOF
then
    cat "$OUT/preflight.txt" >&2
    log "preflight failed (see $OUT/preflight.txt): nothing run"
    exit 2
fi
tee -a "$OUT/driver.log" < "$OUT/preflight.txt" >&2
command -v nvidia-smi > /dev/null && nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1

# 2. calibrate (microbenchmarks only)
PROFILE_ARGS=(--profile "$OUT/calibrate/profile.json" --compare-profiles h200)
if [ "$SMOKE" = 1 ]; then
    log "smoke: calibrate skipped (no GPU); validate predicts from h200 alone"
    PROFILE_ARGS=(--system h200 --compare-profiles "")
else
    run calibrate $(( CAL_BUDGET + 40 )) "$PY" -m megamoe calibrate --out "$OUT/calibrate" --budget "$CAL_BUDGET" ${CALIBRATE_ARGS:-}
    if [ ! -s "$OUT/calibrate/profile.json" ]; then
        log "calibrate wrote no profile: validate predicts from h200 alone"
        PROFILE_ARGS=(--system h200 --compare-profiles "")
    fi
fi

# 3. validate; 4. resume while it stopped early and time is left
VAL_ARGS=(-m megamoe validate "${PROFILE_ARGS[@]}" --out "$OUT/validate")
[ "$SMOKE" = 1 ] && VAL_ARGS+=(--scale --models qwen3-30b-a3b --tokens 1,3 --routings uniform,concentrated --warm-procs 2)
# shellcheck disable=SC2206
VAL_ARGS+=(${VALIDATE_ARGS:-})
EXTRA=()
rc=0
for attempt in 1 2 3; do
    budget=$(( $(left) - 25 ))
    if [ "$budget" -lt 60 ]; then
        log "validate: ${budget} s left of the budget: not started"
        break
    fi
    run validate $(( budget + 45 )) "$PY" "${VAL_ARGS[@]}" --budget "$budget" "${EXTRA[@]}"
    rc=$?
    case $rc in
        3|4|124|137) log "validate stopped early (exit $rc): resuming with what is left" ;;
        *) break ;;
    esac
    EXTRA=(--resume)
    [ -f "$OUT/validate/warm/warm_status.json" ] && EXTRA+=(--no-warm)  # compiled already
done
if [ "$rc" = 124 ] || [ "$rc" = 137 ] || [ ! -f "$OUT/validate/report.md" ]; then
    run report 60 "$PY" -m megamoe validate --report "$OUT/validate" || log "no report: no measured rows"
fi
# the compile-ahead's per-job logs go into one archive: a device tool may return a limited number of files
if [ -d "$OUT/validate/warm" ]; then
    tar czf "$OUT/validate/warm.tgz" -C "$OUT/validate" warm && rm -rf "$OUT/validate/warm"
fi
log "done in $(elapsed) s; files:"
(cd "$OUT" && find . -maxdepth 2 -type f | sort | sed 's/^/    /') | tee -a "$OUT/driver.log" >&2
exit "$rc"
