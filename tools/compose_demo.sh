#!/usr/bin/env bash
# The main job in containers (tools/demo.sh --compose): deploy/docker-compose.yml's CPU job
# (2 shards, 2 workers, mTLS) on a Docker engine, then everything it made removed.
#
# usage: tools/compose_demo.sh [--from-source]
#   default: the binaries built here by Bazel go into deploy/Dockerfile's runtime stage
#            (tools/compose_image.sh); --from-source: the full `docker build -f
#            deploy/Dockerfile .` (Bazel inside the build stage; see docs/deploy.md, Containers).
# Uses a running daemon, or as root installs docker.io and runs a private dockerd that it
# stops at the end (tools/docker_engine.sh). Makes the Debian base images if missing
# (tools/docker_base_images.sh). DPTRAIN_EPOCHS overrides the file's 5 epochs.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/docker_engine.sh
source tools/compose_project.sh

from_source=0
[[ "${1:-}" == "--from-source" ]] && from_source=1
dir=$(mktemp -d)
made=0
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if ((made)); then
    project_remove || rc=1
    echo "compose demo: removed project $PROJECT (containers, network, volumes) and $DPTRAIN_IMAGE"
  fi
  rm -rf "$dir"
  engine_down
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

tools/setup.sh
rc=0
engine_up || rc=$?
((rc == 0)) || exit 1
tools/docker_base_images.sh
project_init dptrain-demo "$dir/project"
made=1
t0=$(date +%s)
if ((from_source)); then
  echo "compose demo: docker build -f deploy/Dockerfile (Bazel inside; minutes)"
  docker_build -f deploy/Dockerfile -t "$DPTRAIN_IMAGE" .
else
  bazel build --config=nocuda //server:ps_server //worker:gpu_worker //deploy:health_probe
  mkdir -p "$dir/bin"
  cp -L bazel-bin/server/ps_server bazel-bin/worker/gpu_worker bazel-bin/deploy/health_probe "$dir/bin/"
  tools/compose_image.sh "$dir/bin" "$DPTRAIN_IMAGE"
fi
echo "compose demo: image $DPTRAIN_IMAGE in $(($(date +%s) - t0)) s"
t0=$(date +%s)
compose up -d 2>&1 | grep -v '^Creating.*\.\.\. $' || true
for w in worker-0 worker-1; do "$DOCKER" wait "$(compose ps -q "$w")" >/dev/null; done
echo "compose demo: job done in $(($(date +%s) - t0)) s"
status=0
for w in worker-0 worker-1; do
  code=$("$DOCKER" inspect -f '{{.State.ExitCode}}' "$(compose ps -q "$w")")
  echo "$w: $(compose logs --no-color "$w" | grep -E 'done:|error' | tail -n 1) -> exit $code"
  ((code == 0)) || status=1
done
exit $status
