# Helpers for the end-to-end shell tests: binaries from the runfiles, a scratch folder,
# processes that are always stopped, JSON fields read with sed.
set -euo pipefail

ROOT="${TEST_SRCDIR:-$PWD}/${TEST_WORKSPACE:-dptrain}"
[[ -d "$ROOT/server" ]] || ROOT="$PWD"
# DPTRAIN_PS_SERVER / DPTRAIN_GPU_WORKER: other builds (tools/gpu/check.sh runs some of these
# tests on a GPU machine with its bundle's binaries).
PS_SERVER="${DPTRAIN_PS_SERVER:-$ROOT/server/ps_server}"
GPU_WORKER="${DPTRAIN_GPU_WORKER:-$ROOT/worker/gpu_worker}"
LAUNCHER="$ROOT/deploy/local_cluster.sh"
SCRATCH="${TEST_TMPDIR:-$(mktemp -d)}"
DATA_DIR="${DPTRAIN_DATA_DIR:-/usr/share/datasets/fashion-mnist}"

_started=()
stop_all() {
  for pid in "${_started[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  sleep 0.2
  for pid in "${_started[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
}
trap stop_all EXIT

die() { echo "FAIL: $*" >&2; exit 1; }

# Tests that need the data fail loudly without it: tools/setup.sh installs it, so its absence
# is a broken machine, not a reason to pass.
need_data() {
  if [[ ! -f "$DATA_DIR/train-images-idx3-ubyte.gz" ]]; then
    die "Fashion-MNIST not found in $DATA_DIR (run tools/setup.sh: apt-get install dataset-fashion-mnist)"
  fi
}

# start_shard INDEX NUM_SHARDS NUM_WORKERS [FLAGS...]: starts a shard on a free port and
# sets SHARD_PORT.
start_shard() {
  local s=$1 n=$2 w=$3
  shift 3
  rm -f "$SCRATCH/shard$s.port"
  "$PS_SERVER" --host=127.0.0.1 --port=0 --port_file="$SCRATCH/shard$s.port" --shard="$s" \
    --num_shards="$n" --num_workers="$w" "$@" >"$SCRATCH/shard$s.log" 2>&1 &
  _started+=($!)
  for _ in $(seq 100); do
    [[ -s "$SCRATCH/shard$s.port" ]] && break
    sleep 0.1
  done
  [[ -s "$SCRATCH/shard$s.port" ]] || die "shard $s did not start: $(cat "$SCRATCH/shard$s.log")"
  SHARD_PORT=$(cat "$SCRATCH/shard$s.port")
}

# json_field FILE EVENT FIELD: the numeric FIELD of the last line with "event":"EVENT".
json_field() {
  grep "\"event\":\"$2\"" "$1" | tail -n 1 | sed -n "s/.*\"$3\":\([-0-9.e]*\).*/\1/p"
}
