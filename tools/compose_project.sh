# One run of deploy/docker-compose.yml as its own compose project; source it after
# tools/docker_engine.sh (engine_up sets DOCKER).
#
# project_init IMAGE_REPO DIR: a unique project name (PROJECT), the compose file and fresh
#   certificates (tools/make_certs.sh) in DIR, DPTRAIN_IMAGE=IMAGE_REPO:PROJECT exported for
#   the file's services.
# compose ARGS...: docker-compose on that project.
# project_remove: down -v (containers, network, volumes) and the image; returns 1 if a
#   container, volume or network of the project is still there.

_project_tools=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

project_init() {
  PROJECT="dpt$(date +%s)$$"
  PROJECT_DIR=$2
  export DPTRAIN_IMAGE="$1:$PROJECT"
  mkdir -p "$PROJECT_DIR"
  cp "$_project_tools/../deploy/docker-compose.yml" "$PROJECT_DIR/"
  # The containers run as uid 10001 and read their key and the token (mode 0600) as theirs.
  "$_project_tools/make_certs.sh" --owner=10001:10001 "$PROJECT_DIR/certs" >/dev/null
}

compose() { docker-compose -p "$PROJECT" -f "$PROJECT_DIR/docker-compose.yml" "$@"; }

project_remove() {
  compose down -v --remove-orphans -t 2 >/dev/null 2>&1 || true
  "$DOCKER" rmi -f "$DPTRAIN_IMAGE" >/dev/null 2>&1 || true
  local label="label=com.docker.compose.project=$PROJECT" left
  left="$("$DOCKER" ps -aq --filter "$label") $("$DOCKER" volume ls -q --filter "$label")"
  left+=" $("$DOCKER" network ls -q --filter "$label")"
  [[ -z "${left// /}" ]] || { echo "left of project $PROJECT: $left" >&2; return 1; }
}
