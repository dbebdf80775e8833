#!/usr/bin/env bash
# Broken workers, with the real binaries (ps mode, 2 shards x 2 workers). Shard crashes and a
# truncated checkpoint are tests/shard_recovery_test.sh. Each case ends either with training
# completed or with a non-zero exit naming what failed: never a hang.
#   1. kill -9 a worker and restart it with the same rank: it rejoins at the shards' step and
#      the job completes (the others waited within --step_timeout).
#   2. SIGSTOP a worker for longer than --step_timeout (6 s): the other exits non-zero naming it;
#      once continued, the stopped one exits non-zero too.
#   3. deploy/local_cluster.sh --restart_shards --checkpoint_every: kill -9 a shard; the
#      launcher restarts it, the workers ride it out and the cluster exits 0.
source "$(dirname "$0")/testlib.sh"
need_data

steps=40
epochs=3
worker_flags=(--world_size=2 --model=lenet --epochs=$epochs --batch_size=32 --threads=1
              --max_steps_per_epoch=$steps --test_subset=500 --seed=3 --data_dir="$DATA_DIR")

start_job() {  # start_job NAME STEP_TIMEOUT: two shards; sets PS.
  local ports=()
  for s in 0 1; do
    start_shard $s 2 2 --step_timeout="$2" --lr=0.05 --momentum=0.9
    ports+=("$SHARD_PORT")
  done
  PS="127.0.0.1:${ports[0]},127.0.0.1:${ports[1]}"
}

start_worker() {  # start_worker NAME RANK: sets WORKER_PID.
  "$GPU_WORKER" --rank="$2" --ps="$PS" "${worker_flags[@]}" >>"$SCRATCH/$1.w$2.log" 2>&1 &
  WORKER_PID=$!
  _started+=($WORKER_PID)
}

wait_for_line() {  # wait_for_line FILE TEXT
  for _ in $(seq 600); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    sleep 0.05
  done
  die "no '$2' in $1: $(tail -n 5 "$1")"
}

# 1. A worker killed and restarted with the same rank.
start_job kill 30s
start_worker kill 0
w0=$WORKER_PID
start_worker kill 1
wait_for_line "$SCRATCH/kill.w1.log" "epoch 1/$epochs"
# At once: epochs 2 and 3 (80 steps of batch 32) can finish in well under a second on a quiet
# machine (a CI run found worker 1 already gone after a 0.5 s sleep here).
kill -KILL $WORKER_PID 2>/dev/null ||
  die "worker 1 exited before it could be killed in epoch 2: $(tail -n 2 "$SCRATCH/kill.w1.log")"
echo "killed worker 1 during epoch 2"
sleep 1
start_worker kill 1
w1=$WORKER_PID
wait $w1 || die "restarted worker 1 failed: $(tail -n 5 "$SCRATCH/kill.w1.log")"
wait $w0 || die "worker 0 failed after its peer restarted: $(tail -n 5 "$SCRATCH/kill.w0.log")"
grep "joins the job at step" "$SCRATCH/kill.w1.log" || die "worker 1 did not rejoin mid-job"
grep -q "rank 0 done: $epochs epochs, $((epochs * steps)) steps" "$SCRATCH/kill.w0.log" ||
  die "worker 0 did not finish every step: $(tail -n 2 "$SCRATCH/kill.w0.log")"
tail -n 1 "$SCRATCH/kill.w0.log"
stop_all
_started=()

# 2. A worker stopped for longer than the step timeout.
start_job stop 6s
start_worker stop 0
w0=$WORKER_PID
start_worker stop 1
w1=$WORKER_PID
wait_for_line "$SCRATCH/stop.w0.log" "epoch 1/$epochs"
kill -STOP $w1 2>/dev/null ||
  die "worker 1 ended before it could be stopped in epoch 2: $(tail -n 2 "$SCRATCH/stop.w1.log")"
stopped_at=$(date +%s.%N)
set +e
wait $w0
rc0=$?
set -e
elapsed=$(echo "$(date +%s.%N) - $stopped_at" | bc)
((rc0 != 0)) || die "worker 0 exited 0 while its peer was stopped"
grep -q "timed out waiting for rank(s) 1" "$SCRATCH/stop.w0.log" ||
  die "worker 0's error does not name rank 1: $(tail -n 2 "$SCRATCH/stop.w0.log")"
awk -v e="$elapsed" 'BEGIN { exit !(e <= 6 + 10) }' || die "took ${elapsed}s to fail (> step_timeout + 10s)"
echo "worker 0 failed after ${elapsed}s: $(tail -n 1 "$SCRATCH/stop.w0.log")"
kill -CONT $w1
set +e
timeout 30 tail --pid=$w1 -f /dev/null
wait $w1
rc1=$?
set -e
((rc1 != 0 && rc1 != 124)) || die "stopped worker 1: exit $rc1 (0 = went on alone, 124 = hung)"
echo "worker 1 (continued) exited $rc1: $(tail -n 1 "$SCRATCH/stop.w1.log")"
stop_all
_started=()

# 3. The local launcher restarts a killed shard.
logs="$SCRATCH/cluster"
"$LAUNCHER" --bin="$ROOT" --mode=ps --shards=2 --workers=2 --lr=0.05 --momentum=0.9 \
  --step_timeout=30s --checkpoint_every=5 --restart_shards --logs="$logs" -- \
  --model=lenet --epochs=$epochs --batch_size=32 --threads=1 --max_steps_per_epoch=$steps \
  --test_subset=500 --data_dir="$DATA_DIR" >"$SCRATCH/cluster.out" 2>&1 &
cluster=$!
_started+=($cluster)
wait_for_line "$logs/worker0.log" "epoch 1/$epochs"
shard_pid=$(pgrep -f -- "--port_file=$logs/shard1.port" | head -n 1)
[[ -n "$shard_pid" ]] || die "cannot find shard 1's process"
kill -KILL "$shard_pid"
echo "killed shard 1 (pid $shard_pid) under the launcher"
set +e
timeout 120 tail --pid=$cluster -f /dev/null
wait $cluster
rc=$?
set -e
((rc == 0)) || die "local_cluster exited $rc: $(tail -n 8 "$SCRATCH/cluster.out")"
grep "restarting it on port" "$SCRATCH/cluster.out" || die "the launcher did not restart shard 1"
grep -h "restored step" "$logs/shard1.log" || die "shard 1 did not restore a checkpoint"
echo PASS
