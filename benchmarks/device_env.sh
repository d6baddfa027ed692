# Source on the GPU machine, from the repository root, before any benchmark there:
#   export MEGAMOE_COMMIT=<commit the tree was copied from> MEGAMOE_DIRTY=0; source benchmarks/device_env.sh
# The device's copy of the tree may hold a stale .git (it would name the wrong commit), so it is
# moved aside and rows take MEGAMOE_COMMIT (kernels.bench.git_state); the package is reached as
# megamoe.* through symlinks and PYTHONPATH, with no pip install; simpy, which the GPU image lacks,
# comes as a wheel in .whl/ (carried: `carry: [".whl"]`).
set -o pipefail
export PYTHONUNBUFFERED=1
if [ -z "${MEGAMOE_COMMIT:-}" ]; then echo "device_env.sh: set MEGAMOE_COMMIT first" >&2; return 2; fi
mv .git /tmp/git.stale 2>/dev/null || true
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
for d in reference simulator kernels; do ln -sfn ../$d megamoe/$d; done
export PYTHONPATH=$PWD:/tmp/site
