#!/usr/bin/env bash
# The main job: installs dependencies, builds, and trains LeNet on Fashion-MNIST with a local
# cluster of 2 ps_server shards and 2 gpu_worker processes on loopback.
# Extra arguments go to every worker (e.g. --epochs=10).
# --compose [--from-source]: the same kind of job in containers instead
# (deploy/docker-compose.yml on a Docker engine; tools/compose_demo.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "--compose" ]]; then
  shift
  exec tools/compose_demo.sh "$@"
fi
tools/setup.sh
bazel build //server:ps_server //worker:gpu_worker
deploy/local_cluster.sh --shards=2 --workers=2 --lr=0.9 --logs="${DPTRAIN_LOGS:-/tmp/dptrain-demo}" \
  -- --model=lenet --epochs=5 --batch_size=128 --threads=1 "$@"
