# A Docker engine for the compose demo and tests; source it, then call engine_up and (in an
# EXIT trap) engine_down.
#
# engine_up: uses a running daemon if `docker info` reaches one (DOCKER_HOST or the default
# socket). Otherwise, as root, installs Debian's docker.io if dockerd is missing and starts a
# private dockerd: its own --data-root ($DPTRAIN_DOCKER_ROOT, default /var/lib/dptrain-docker,
# kept between runs as a cache of base images and layers), exec-root, pidfile and socket
# (/run/dptrain-docker/docker.sock), and exports DOCKER_HOST for docker and docker-compose.
# Not root and no daemon: one line on stderr saying what is missing, returns 77 (skip).
# Sets DOCKER (the CLI to use; BuildKit-capable builds go through docker_build).
# engine_down: stops the daemon only if engine_up started it; never another one.

DPTRAIN_DOCKER_ROOT=${DPTRAIN_DOCKER_ROOT:-/var/lib/dptrain-docker}
_engine_run=/run/dptrain-docker
_engine_pid=""

_engine_cli() {
  # Debian's docker.io CLI (20.10) builds with BuildKit without the buildx plugin; a newer
  # CLI needs buildx for that. Prefer one that can.
  if docker buildx version >/dev/null 2>&1; then
    DOCKER=docker
  elif [[ -x /usr/bin/docker ]]; then
    DOCKER=/usr/bin/docker
  else
    DOCKER=docker
  fi
}

engine_up() {
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    _engine_cli
    echo "docker: using the running daemon ($(docker version -f '{{.Server.Version}}'))"
    return 0
  fi
  if ((EUID != 0)); then
    echo "no Docker daemon reachable and not root: start one you may use (docker info must" \
      "work), or run as root so that Debian's docker.io is installed and a private dockerd started" >&2
    return 77
  fi
  if ! command -v dockerd >/dev/null; then
    echo "docker: installing Debian's docker.io (dockerd, containerd, runc)"
    DEBIAN_FRONTEND=noninteractive apt-get install -o DPkg::Lock::Timeout=300 -y -qq \
      --no-install-recommends docker.io >/dev/null ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -o DPkg::Lock::Timeout=300 \
        -y -qq --no-install-recommends docker.io >/dev/null; } ||
      { echo "docker: apt-get install docker.io failed" >&2; return 1; }
  fi
  mkdir -p "$_engine_run" "$DPTRAIN_DOCKER_ROOT"
  if [[ -s "$_engine_run/dockerd.pid" ]] && kill -0 "$(cat "$_engine_run/dockerd.pid")" 2>/dev/null; then
    echo "docker: a private dockerd of another run is up (pid $(cat "$_engine_run/dockerd.pid")," \
      "$_engine_run); wait for it to end" >&2
    return 1
  fi
  export DOCKER_HOST="unix://$_engine_run/docker.sock"
  dockerd --data-root="$DPTRAIN_DOCKER_ROOT" --exec-root="$_engine_run/exec" \
    --pidfile="$_engine_run/dockerd.pid" --host="$DOCKER_HOST" --storage-driver=overlay2 \
    >"$_engine_run/dockerd.log" 2>&1 &
  _engine_pid=$!
  local i
  for i in $(seq 300); do
    docker info >/dev/null 2>&1 && break
    kill -0 "$_engine_pid" 2>/dev/null || break
    sleep 0.1
  done
  if ! docker info >/dev/null 2>&1; then
    echo "docker: dockerd did not start; its last lines:" >&2
    tail -n 15 "$_engine_run/dockerd.log" >&2
    engine_down
    return 1
  fi
  _engine_cli
  echo "docker: started a private dockerd $(docker version -f '{{.Server.Version}}')" \
    "(pid $_engine_pid, data root $DPTRAIN_DOCKER_ROOT, $DOCKER_HOST); stopped at the end"
}

engine_down() {
  [[ -n "$_engine_pid" ]] || return 0
  kill -TERM "$_engine_pid" 2>/dev/null || true
  local i
  for i in $(seq 300); do
    kill -0 "$_engine_pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$_engine_pid" 2>/dev/null || true
  wait "$_engine_pid" 2>/dev/null || true
  echo "docker: stopped the private dockerd (pid $_engine_pid)"
  _engine_pid=""
}

# docker_build ARGS...: `docker build` with BuildKit (stages a target does not need are
# skipped, so a runtime image from prebuilt binaries does not run the Bazel stage). On
# failure prints the build's last lines and returns non-zero.
docker_build() {
  local log
  log=$(mktemp)
  if ! DOCKER_BUILDKIT=1 "$DOCKER" build --progress=plain "$@" >"$log" 2>&1; then
    echo "docker build failed; its last lines:" >&2
    tail -n 25 "$log" >&2
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
}
