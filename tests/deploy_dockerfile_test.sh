#!/usr/bin/env bash
# deploy/Dockerfile and deploy/Dockerfile.cuda, checked without a Docker engine:
# - the build stage installs exactly tools/setup.sh's packages (it runs setup.sh) and runs the
#   README's `bazel build` targets with --config=nocuda (plus deploy/BUILD's health_probe);
# - every shared library that ldd finds for the built binaries belongs (dpkg -S) to a package
#   the runtime stage installs, and the runtime stage installs nothing else but the data set
#   and tini; non-root user; binaries in /usr/local/bin; ps-server/gpu-worker targets;
# - Dockerfile.cuda builds the same way on a CUDA 13 cuDNN runtime base;
# - the checker catches a dropped runtime library and a drifted build command (mutations).
source "$(dirname "$0")/testlib.sh"
CHECK="$ROOT/deploy/check_deploy.py"
HEALTH_PROBE="$ROOT/deploy/health_probe"
command -v dpkg >/dev/null || { echo "SKIPPED: no dpkg (not a Debian system)"; exit 0; }
# tools/ exports no files to Bazel: find setup.sh beside the real deploy/Dockerfile.
SETUP="$ROOT/tools/setup.sh"
[[ -f "$SETUP" ]] || SETUP="$(dirname "$(readlink -f "$ROOT/deploy/Dockerfile")")/../tools/setup.sh"
[[ -f "$SETUP" ]] || die "tools/setup.sh not found"

check() {  # check DOCKERFILE CUDA_DOCKERFILE
  python3 "$CHECK" dockerfile --dockerfile="$1" --cuda="$2" --setup="$SETUP" \
    --readme="$ROOT/README.md" --deploy_build="$ROOT/deploy/BUILD" \
    "$PS_SERVER" "$GPU_WORKER" "$HEALTH_PROBE"
}

check "$ROOT/deploy/Dockerfile" "$ROOT/deploy/Dockerfile.cuda" || die "Dockerfile checks failed"

# The checks must bite: copies with one runtime library dropped / the build command changed.
mut="$SCRATCH/mut"
mkdir -p "$mut"
cp "$ROOT/deploy/Dockerfile.dockerignore" "$mut/Dockerfile.dockerignore"
cp "$ROOT/deploy/Dockerfile.cuda.dockerignore" "$mut/Dockerfile.cuda.dockerignore"
cp "$ROOT/deploy/Dockerfile.cuda" "$mut/Dockerfile.cuda"
grep -v '^      libprotobuf32 \\$' "$ROOT/deploy/Dockerfile" >"$mut/Dockerfile"
if check "$mut/Dockerfile" "$mut/Dockerfile.cuda" >"$SCRATCH/m1.txt"; then
  die "a runtime stage without libprotobuf32 passed"
fi
grep -q "runtime stage lacks libprotobuf32" "$SCRATCH/m1.txt" || die "$(cat "$SCRATCH/m1.txt")"
sed 's|bazel build --config=nocuda //server:ps_server //worker:gpu_worker|bazel build //server:ps_server|' \
  "$ROOT/deploy/Dockerfile" >"$mut/Dockerfile"
if check "$mut/Dockerfile" "$mut/Dockerfile.cuda" >"$SCRATCH/m2.txt"; then
  die "a build command without --config=nocuda and //worker:gpu_worker passed"
fi
grep -q "lacks --config=nocuda" "$SCRATCH/m2.txt" || die "$(cat "$SCRATCH/m2.txt")"
grep -q "misses the README's targets \['//worker:gpu_worker'\]" "$SCRATCH/m2.txt" \
  || die "$(cat "$SCRATCH/m2.txt")"
echo "mutations caught: dropped runtime library, drifted build command"
echo PASS
