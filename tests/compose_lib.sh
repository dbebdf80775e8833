# Helpers for the tests that run deploy/docker-compose.yml on a real Docker engine: an engine
# (a running one, or a private dockerd: tools/docker_engine.sh), the base images, a runtime
# image of this build's binaries, a compose project of its own (unique name, its own copy
# of the file with fresh certificates), all removed at exit, also on failure or interrupt.
source "$(dirname "$0")/testlib.sh"
source "$ROOT/tools/docker_engine.sh"
source "$ROOT/tools/compose_project.sh"

_compose_made=0

compose_cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  stop_all  # helpers such as `docker events` first, before their daemon goes
  if ((_compose_made)); then
    if ((rc != 0)); then
      echo "--- compose logs (last lines) ---"
      compose logs --no-color --tail=15 2>/dev/null || true
    fi
    project_remove || rc=1
  fi
  engine_down
  exit "$rc"
}
trap compose_cleanup EXIT
trap 'exit 130' INT TERM

# compose_setup: engine, base images, image, certificates; skips the test visibly where no
# engine can run (not root, no daemon).
compose_setup() {
  local rc=0
  export HOME="${HOME:-$SCRATCH}"
  engine_up || rc=$?
  if ((rc == 77)); then
    echo "SKIPPED: no Docker engine (see the line above); run as root or with a daemon"
    exit 0
  fi
  ((rc == 0)) || die "no Docker engine"
  command -v docker-compose >/dev/null || die "docker-compose missing (run tools/setup.sh)"
  "$ROOT/tools/docker_base_images.sh" || die "base images"
  mkdir -p "$SCRATCH/bin"
  cp -L "$PS_SERVER" "$GPU_WORKER" "$ROOT/deploy/health_probe" "$SCRATCH/bin/"
  project_init dptrain-test "$SCRATCH/compose"
  IMAGE=$DPTRAIN_IMAGE
  _compose_made=1
  "$ROOT/tools/compose_image.sh" "$SCRATCH/bin" "$IMAGE" || die "image build"
  echo "project $PROJECT, image $IMAGE"
}

# cid SERVICE: the container of SERVICE.
cid() { compose ps -q "$1"; }

# wait_exit TIMEOUT_S SERVICE...: waits for the services' containers to exit; fails after
# TIMEOUT_S seconds (a hang).
wait_exit() {
  local limit=$1 s
  shift
  for _ in $(seq $((limit * 2))); do
    local running=0
    for s in "$@"; do
      [[ "$("$DOCKER" inspect -f '{{.State.Running}}' "$(cid "$s")")" == true ]] && running=1
    done
    ((running)) || return 0
    sleep 0.5
  done
  die "still running after ${limit}s: $*"
}

exit_code() { "$DOCKER" inspect -f '{{.State.ExitCode}}' "$(cid "$1")"; }
health() { "$DOCKER" inspect -f '{{.State.Health.Status}}' "$(cid "$1")"; }

# volume_cat VOLUME FILE: a file from one of the project's named volumes.
volume_cat() {
  "$DOCKER" run --rm --network none -v "${PROJECT}_$1:/v:ro" --entrypoint cat "$IMAGE" "/v/$2"
}
