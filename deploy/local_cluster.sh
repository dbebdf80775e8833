#!/usr/bin/env bash
# Starts S ps_server shards and N gpu_worker processes on loopback (free ports, one log per
# process) and waits for the workers. If any process fails, the rest are stopped and the
# failure is reported; Ctrl-C stops everything. No process outlives this script.
#
# usage: deploy/local_cluster.sh [--mode=ps|master|allreduce] [--shards=2] [--workers=2]
#          [--lr=0.1] [--momentum=0] [--weight_decay=0] [--step_timeout=60s]
#          [--sync=bsp|ssp|async] [--staleness=0] [--logs=DIR] [--certs=DIR]
#          [--checkpoint_every=0] [--restart_shards] [--bin=DIR] [--shard_optimizer=NAME]
#          [-- WORKER_FLAGS...]  |  [--run] -- COMMAND...
# ps mode starts the shards; master and allreduce modes start workers only (rank 0 hosts the
# reducer or the rendezvous on a free port), except with --run and an explicit --shards=S:
# then S shards hold the job's sparse embedding tables (dptrain.torch.SparseEmbedding) while
# the dense gradients take the mode's way. WORKER_FLAGS go to every worker
# (e.g. --model=lenet --epochs=5 --batch_size=128). Each worker gets LOCAL_RANK=<its rank> and
# LOCAL_WORLD_SIZE=<workers>: its share of the cores, and on a host with GPUs its own GPU
# (gpu_worker --device=auto|cuda: GPU LOCAL_RANK mod the visible GPUs).
# --run: each worker is COMMAND instead (a PyTorch script using dptrain.torch, e.g.
# `--run -- python3 examples/torch/train_fashion_mnist.py --epochs=1`) with torchrun's
# environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT on a
# free port) plus DPTRAIN_MODE, DPTRAIN_PS, DPTRAIN_TLS_* and DPTRAIN_JOB_TOKEN_FILE (--certs),
# PYTHONPATH and DPTRAIN_NATIVE_LIB (the built package). Its shards only average
# (--optimizer=none, for DistributedOptimizer) unless --shard_optimizer says otherwise (sgd,
# adam, adamw: for ServerOptimizer, with --lr, --momentum, --sync...). --certs=DIR (made by
# tools/make_certs.sh --shards=S --workers=N DIR): every process runs with mutual TLS and
# the job token (shard s: ps-s.crt/.key, worker r: worker-r.crt/.key, ca.crt, job_token);
# without it everything is plaintext on loopback, and each process warns once.
# Any other --FLAG[=VALUE] before `--` goes to the processes that run the job's optimizer:
# the shards in ps mode (e.g. --optimizer=adam --lr_schedule=cosine --lr_total_steps=500
# --metrics_port=0), the workers in master and allreduce mode; the binary's own --helpfull
# decides whether it is one of its flags (no second list here), else it is refused. "{i}" in
# a value becomes the shard's index or the worker's rank (--trace_out=/tmp/trace{i}.json).
# --checkpoint_every=N: each shard writes a checkpoint every N steps into LOGS/ckpt<s>.
# --restart_shards: a shard that dies is started again on its port (up to 5 times each); it
# restores its newest checkpoint and the workers ride it out (gpu_worker --reconnect_timeout).
set -euo pipefail

mode=ps shards=2 workers=2 lr=0.1 momentum=0 weight_decay=0 step_timeout=60s sync=bsp staleness=0
logs="" bin="" certs="" checkpoint_every=0 restart_shards=0 run=0 shard_optimizer="" shards_given=0
worker_flags=() passed_flags=()
while (($#)); do
  case "$1" in
    --mode=*) mode="${1#*=}" ;;
    --shards=*) shards="${1#*=}" shards_given=1 ;;
    --workers=*) workers="${1#*=}" ;;
    --lr=*) lr="${1#*=}" ;;
    --momentum=*) momentum="${1#*=}" ;;
    --weight_decay=*) weight_decay="${1#*=}" ;;
    --step_timeout=*) step_timeout="${1#*=}" ;;
    --sync=*) sync="${1#*=}" ;;
    --staleness=*) staleness="${1#*=}" ;;
    --logs=*) logs="${1#*=}" ;;
    --bin=*) bin="${1#*=}" ;;
    --certs=*) certs="${1#*=}" ;;
    --checkpoint_every=*) checkpoint_every="${1#*=}" ;;
    --restart_shards) restart_shards=1 ;;
    --run) run=1 ;;
    --shard_optimizer=*) shard_optimizer="${1#*=}" ;;
    --) shift; worker_flags=("$@"); break ;;
    -h|--help) sed -n '2,35p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --*) passed_flags+=("$1") ;;  # Checked against the binary below.
    *) echo "local_cluster: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ "$shards" =~ ^[1-9][0-9]*$ ]] || { echo "local_cluster: --shards must be >= 1" >&2; exit 2; }
[[ "$workers" =~ ^[1-9][0-9]*$ ]] || { echo "local_cluster: --workers must be >= 1" >&2; exit 2; }
[[ "$checkpoint_every" =~ ^[0-9]+$ ]] || { echo "local_cluster: --checkpoint_every must be >= 0" >&2; exit 2; }
case "$mode" in ps|master|allreduce) ;; *) echo "local_cluster: --mode must be ps, master or allreduce" >&2; exit 2 ;; esac
[[ "$mode" == ps ]] || ((run && shards_given)) || shards=0
((run == 0 || ${#worker_flags[@]} > 0)) || { echo "local_cluster: --run needs a command after --" >&2; exit 2; }
[[ -n "$shard_optimizer" ]] || { ((run)) && shard_optimizer=none || shard_optimizer=sgd; }

here="$(cd "$(dirname "$0")/.." && pwd)"
bin="${bin:-$here/bazel-bin}"
ps_server="$bin/server/ps_server"
gpu_worker="$bin/worker/gpu_worker"
needed=("$ps_server")
((run)) && needed+=("$bin/python/native/libdptrain_c.so") || needed+=("$gpu_worker")
for b in "${needed[@]}"; do
  [[ -e "$b" ]] || { echo "local_cluster: $b not found; build first (bazel build //...)" >&2; exit 2; }
done
# The flags passed through go to the shards (ps mode) or the workers; each must be a flag of
# that binary, as its --helpfull lists them.
if ((${#passed_flags[@]})); then
  ((run == 0 || shards > 0)) ||
    { echo "local_cluster: ${passed_flags[0]}: with --run in $mode mode the workers are your command; give it its flags after --" >&2; exit 2; }
  target="$gpu_worker"
  [[ "$mode" == ps ]] || ((run)) && target="$ps_server"
  # (--helpfull exits non-zero after printing.)
  known=$({ "$target" --helpfull 2>&1 || true; } | sed -n 's/^ *--\([a-z0-9_]*\) .*/\1/p')
  for f in "${passed_flags[@]}"; do
    name="${f#--}"
    name="${name%%=*}"
    grep -qx "$name" <<<"$known" ||
      { echo "local_cluster: $f is not a flag of $(basename "$target") (see $(basename "$target") --helpfull)" >&2; exit 2; }
  done
fi
# passed_for I: the passed-through flags with "{i}" replaced by I.
passed_for() {
  local f
  for f in "${passed_flags[@]}"; do printf '%s\n' "${f//\{i\}/$1}"; done
}

# security NAME: the flags of process NAME (ps-0, worker-1, ...) under --certs.
security() {
  [[ -n "$certs" ]] || return 0
  echo "--tls_cert=$certs/$1.crt" "--tls_key=$certs/$1.key" "--tls_ca=$certs/ca.crt" \
    "--job_token_file=$certs/job_token"
}
if [[ -n "$certs" ]]; then
  names=()
  for ((s = 0; s < shards; s++)); do names+=("ps-$s"); done
  for ((r = 0; r < workers; r++)); do names+=("worker-$r"); done
  for f in ca.crt job_token "${names[@]/%/.crt}" "${names[@]/%/.key}"; do
    [[ -r "$certs/$f" ]] || { echo "local_cluster: $certs/$f missing (tools/make_certs.sh --shards=$shards --workers=$workers $certs)" >&2; exit 2; }
  done
fi
logs="${logs:-$(mktemp -d -t dptrain-cluster.XXXXXX)}"
mkdir -p "$logs"

declare -A role_of=()  # pid -> "shard i" / "worker r"
pids=()
cleanup() {
  trap - EXIT INT TERM
  local alive=()
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive+=("$pid"); done
  if ((${#alive[@]})); then
    kill -TERM "${alive[@]}" 2>/dev/null || true
    for _ in $(seq 20); do
      local any=0
      for pid in "${alive[@]}"; do kill -0 "$pid" 2>/dev/null && any=1; done
      ((any)) || break
      sleep 0.1
    done
    kill -KILL "${alive[@]}" 2>/dev/null || true
  fi
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'echo "local_cluster: interrupted, stopping everything" >&2; exit 130' INT TERM

fail() {
  echo "local_cluster: FAILED: $*" >&2
  exit 1
}

echo "local_cluster: $mode mode, $shards shard(s), $workers worker(s), logs in $logs$([[ -n "$certs" ]] && echo ", mutual TLS + job token from $certs")"
# start_shard S [PORT]: on a free port (reported in LOGS/shardS.port), or on PORT (a restart).
declare -A restarts=()
start_shard() {
  local s=$1 port=${2:-0}
  local ckpt=()
  ((checkpoint_every > 0)) && ckpt=(--checkpoint_dir="$logs/ckpt$s" --checkpoint_every="$checkpoint_every")
  ((port == 0)) && rm -f "$logs/shard$s.port"
  "$ps_server" --shard="$s" --num_shards="$shards" --num_workers="$workers" --port="$port" \
    --host=127.0.0.1 --port_file="$logs/shard$s.port" --lr="$lr" --momentum="$momentum" \
    --weight_decay="$weight_decay" --step_timeout="$step_timeout" --sync="$sync" \
    --optimizer="$shard_optimizer" \
    --staleness="$staleness" $(security "ps-$s") "${ckpt[@]}" \
    $(passed_for "$s") >>"$logs/shard$s.log" 2>&1 &
  pids+=($!)
  role_of[$!]="shard $s"
}
for ((s = 0; s < shards; s++)); do
  : >"$logs/shard$s.log"
  start_shard "$s"
done

addresses=()
for ((s = 0; s < shards; s++)); do
  for _ in $(seq 300); do
    [[ -s "$logs/shard$s.port" ]] && break
    kill -0 "${pids[$s]}" 2>/dev/null || fail "shard $s exited at start: $(tail -n 3 "$logs/shard$s.log")"
    sleep 0.1
  done
  [[ -s "$logs/shard$s.port" ]] || fail "shard $s did not report a port within 30s"
  addresses+=("127.0.0.1:$(cat "$logs/shard$s.port")")
done
mode_flags=(--mode="$mode")
if [[ "$mode" == ps ]]; then
  ps_list="$(IFS=,; echo "${addresses[*]}")"
  echo "local_cluster: parameter servers at $ps_list"
  mode_flags+=(--ps="$ps_list")
else
  mode_flags+=(--master_addr=127.0.0.1 --advertise_host=127.0.0.1 --bind_address=127.0.0.1
               --momentum="$momentum"
               --weight_decay="$weight_decay" --step_timeout="$step_timeout")
  [[ "$mode" == master ]] && mode_flags+=(--sync="$sync" --staleness="$staleness")
fi

start_worker() {
  local r=$1
  shift
  # All the workers share this host: each takes its share of the cores (--threads=auto) and,
  # under --device=auto|cuda, GPU LOCAL_RANK mod the GPUs it sees (one GPU per worker while
  # there are enough; --device=cuda:N in WORKER_FLAGS puts every worker on GPU N).
  LOCAL_WORLD_SIZE="$workers" LOCAL_RANK="$r" \
  "$gpu_worker" "${mode_flags[@]}" --rank="$r" --world_size="$workers" --lr="$lr" \
    --metrics_out="$logs/worker$r.jsonl" $(security "worker-$r") "$@" \
    $([[ "$mode" == ps ]] || passed_for "$r") "${worker_flags[@]}" \
    > >(tee "$logs/worker$r.log" | sed -u "s/^/[worker $r] /") 2>&1 &
  pids+=($!)
  role_of[$!]="worker $r"
}

# run_command R: rank R of a --run job, with torchrun's environment and dptrain.torch's.
run_command() {
  local r=$1
  local env=(RANK="$r" WORLD_SIZE="$workers" LOCAL_RANK="$r" LOCAL_WORLD_SIZE="$workers"
             MASTER_ADDR=127.0.0.1 MASTER_PORT="$master_port" DPTRAIN_MODE="$mode"
             PYTHONPATH="$here/python${PYTHONPATH:+:$PYTHONPATH}"
             DPTRAIN_NATIVE_LIB="$bin/python/native/libdptrain_c.so")
  ((shards > 0)) && env+=(DPTRAIN_PS="$(IFS=,; echo "${addresses[*]}")")
  [[ -n "$certs" ]] && env+=(DPTRAIN_TLS_CERT="$certs/worker-$r.crt"
                             DPTRAIN_TLS_KEY="$certs/worker-$r.key" DPTRAIN_TLS_CA="$certs/ca.crt"
                             DPTRAIN_JOB_TOKEN_FILE="$certs/job_token")
  env "${env[@]}" "${worker_flags[@]}" \
    > >(tee "$logs/worker$r.log" | sed -u "s/^/[worker $r] /") 2>&1 &
  pids+=($!)
  role_of[$!]="worker $r"
}

if ((run)); then
  # A free port whose successor is free too (master mode's reducer listens on MASTER_PORT+1).
  master_port=$(python3 -c 'import socket
for _ in range(100):
    a, b = socket.socket(), socket.socket()
    try:
        a.bind(("127.0.0.1", 0)); p = a.getsockname()[1]; b.bind(("127.0.0.1", p + 1))
        print(p); break
    except OSError: pass
    finally: a.close(); b.close()')
  echo "local_cluster: running '${worker_flags[*]}' as each of $workers worker(s), MASTER_PORT=$master_port"
  for ((r = 0; r < workers; r++)); do run_command "$r"; done
elif [[ "$mode" == ps ]]; then
  for ((r = 0; r < workers; r++)); do start_worker "$r"; done
else
  # Rank 0 picks a free port and reports it; the others are told.
  rm -f "$logs/master.port"
  start_worker 0 --master_port=0 --port_file="$logs/master.port"
  for _ in $(seq 600); do
    [[ -s "$logs/master.port" ]] && break
    kill -0 "${pids[-1]}" 2>/dev/null || fail "worker 0 exited at start: $(tail -n 3 "$logs/worker0.log")"
    sleep 0.1
  done
  [[ -s "$logs/master.port" ]] || fail "worker 0 did not report its port within 60s"
  echo "local_cluster: rank 0 listens on 127.0.0.1:$(cat "$logs/master.port")"
  for ((r = 1; r < workers; r++)); do start_worker "$r" --master_port="$(cat "$logs/master.port")"; done
fi

remaining=$workers
while ((remaining > 0)); do
  set +e
  wait -n -p done_pid "${pids[@]}"
  rc=$?
  set -e
  role="${role_of[$done_pid]:-process $done_pid}"
  case "$role" in
    worker*)
      log="$logs/${role/ /}.log"
      ((rc == 0)) || fail "$role exited with status $rc; last lines of $log:
$(tail -n 5 "$log")"
      remaining=$((remaining - 1))
      ;;
    shard*)
      s=${role#shard }
      n=${restarts[$s]:-0}
      if ((restart_shards && n < 5)); then
        restarts[$s]=$((n + 1))
        echo "local_cluster: shard $s exited (status $rc); restarting it on port $(cat "$logs/shard$s.port") (restart $((n + 1)) of at most 5)" >&2
        start_shard "$s" "$(cat "$logs/shard$s.port")"
      else
        fail "$role exited (status $rc) while workers were running; last lines of $logs/${role/ /}.log:
$(tail -n 5 "$logs/${role/ /}.log")"
      fi
      ;;
    *)
      fail "$role exited (status $rc) while workers were running"
      ;;
  esac
  # Forget the finished pid.
  for i in "${!pids[@]}"; do [[ "${pids[$i]}" == "$done_pid" ]] && unset 'pids[i]'; done
  pids=("${pids[@]}")
done

echo "local_cluster: all $workers worker(s) finished; summary:"
for ((r = 0; r < workers; r++)); do grep -h ' done:' "$logs/worker$r.log" | sed "s/^/  /" || true; done
((run)) || echo "local_cluster: metrics (JSON lines) in $logs/worker*.jsonl"
# Training curves beside the logs (tools/plot_curves.py with Debian's python3-matplotlib, so
# /usr/bin/python3 first: a python3 earlier on the PATH may lack it).
python=$(command -v /usr/bin/python3 || command -v python3 || true)
plot=""
for candidate in "$(dirname "$0")/../tools" "$(dirname "$(readlink -f "$0")")/../tools" \
  "$0.runfiles/dptrain/tools" "$PWD/tools"; do
  [[ -f "$candidate/plot_curves.py" ]] && { plot="$candidate/plot_curves.py"; break; }
done
if ((run)); then
  :  # A script's own metrics are its own.
elif [[ -n "$plot" && -n "$python" ]] && "$python" -c 'import matplotlib' 2>/dev/null; then
  "$python" "$plot" --out="$logs/curves.png" --title="$mode mode, $workers worker(s)" \
    "$logs"/worker*.jsonl | sed 's/^/local_cluster: /' || echo "local_cluster: no curves (see above)" >&2
else
  echo "local_cluster: no curves drawn (tools/plot_curves.py needs python3-matplotlib)"
fi
