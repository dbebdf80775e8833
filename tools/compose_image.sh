#!/usr/bin/env bash
# Builds deploy/Dockerfile's runtime image from binaries already built here, instead of
# running the Bazel stage inside Docker (minutes on 2 cores): the same runtime stage, package
# list and user that `docker build -f deploy/Dockerfile .` gives, with ps_server, gpu_worker
# and health_probe from BIN_DIR.
#
# usage: tools/compose_image.sh BIN_DIR TAG
#   BIN_DIR holds ps_server, gpu_worker, health_probe (e.g. copied from bazel-bin).
# Needs an engine (source tools/docker_engine.sh; engine_up) and the base images
# (tools/docker_base_images.sh). The helper image dptrain-bin:* is removed afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/docker_engine.sh
[[ -n "${DOCKER:-}" ]] || _engine_cli
bin_dir=$1 tag=$2
ctx=$(mktemp -d)
bin_image="dptrain-bin:$(basename "$ctx" | tr 'A-Z' 'a-z' | tr -cd 'a-z0-9')"
trap '"$DOCKER" rmi -f "$bin_image" >/dev/null 2>&1 || true; rm -rf "$ctx"' EXIT
mkdir -p "$ctx/bin" "$ctx/empty"
for b in ps_server gpu_worker health_probe; do
  [[ -x "$bin_dir/$b" ]] || { echo "compose image: $bin_dir/$b missing" >&2; exit 1; }
  cp -L "$bin_dir/$b" "$ctx/bin/"
done
printf 'FROM scratch\nCOPY . /out/\n' >"$ctx/Dockerfile.bin"
docker_build -f "$ctx/Dockerfile.bin" -t "$bin_image" "$ctx/bin"
# An empty context: the runtime stage copies from images only. The Dockerfile is copied
# (a Bazel runfiles symlink would not reach BuildKit).
cp -L deploy/Dockerfile "$ctx/Dockerfile"
docker_build -f "$ctx/Dockerfile" --build-arg BINARIES="$bin_image" --target=runtime \
  -t "$tag" "$ctx/empty"
echo "compose image: $tag ($("$DOCKER" image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}'))"
