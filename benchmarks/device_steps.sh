#!/usr/bin/env bash
# Run a list of benchmark steps in one device call, each under its own time limit, and pack what
# they wrote into OUT/all.tgz after every step (a call cut short still returns the finished steps;
# the device returns a limited number of files, so everything travels as one archive).
#
#   source benchmarks/device_env.sh; bash benchmarks/device_steps.sh OUT STEPS_FILE [TOTAL_S]
#
# STEPS_FILE: one step per line, "NAME LIMIT_S COMMAND...", '#' starts a comment. A command
# writes under $W (its own folder, /tmp/steps/NAME); its stdout and stderr go to $W/log.txt.
# A step starts only while its limit fits in what is left of TOTAL_S (default 570); one whose limit
# no longer fits gets what is left, if that is at least 20 s. STEPS_ROOT: the folder the steps
# write under (default a fresh /tmp/steps.XXXXXX), packed as it is.
set -u -o pipefail
OUT=${1:?usage: device_steps.sh OUT STEPS_FILE [TOTAL_S]}
STEPS=${2:?usage: device_steps.sh OUT STEPS_FILE [TOTAL_S]}
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
