#!/usr/bin/env bash
# A job whose shards are killed (kill -9) and restarted mid-training ends with weights
# bit-identical to the same job run without the crash (issue 12): ps mode, 2 shards x 2
# workers, BSP, SGD with momentum (optimizer state must come back too), each shard killed
# once and restarted with the same flags from its --checkpoint_dir; shard 1's newest
# checkpoint is truncated before its restart (a crash mid-write, a bad disk), so it must
# fall back to the one before and every shard must go back that far.
source "$(dirname "$0")/testlib.sh"
need_data

steps_per_epoch=60
epochs=3
shard_flags=(--step_timeout=20s --lr=0.05 --momentum=0.9 --checkpoint_every=7)
worker_flags=(--world_size=2 --model=lenet --epochs=$epochs --batch_size=32 --threads=1
              --max_steps_per_epoch=$steps_per_epoch --test_subset=500 --seed=7
              --reconnect_timeout=60s --data_dir="$DATA_DIR")

# run_job NAME [KILL]: trains to the end; with KILL, kills and restarts each shard once.
run_job() {
  local name=$1 kill_shards=${2:-}
  local dir="$SCRATCH/$name"
  mkdir -p "$dir"
  local ports=()
  for s in 0 1; do
    start_shard $s 2 2 "${shard_flags[@]}" --checkpoint_dir="$dir/ckpt$s"
    ports+=("$SHARD_PORT")
    pids[$s]=${_started[-1]}
  done
  local ps="127.0.0.1:${ports[0]},127.0.0.1:${ports[1]}"
  for r in 0 1; do
    "$GPU_WORKER" --rank=$r --ps="$ps" "${worker_flags[@]}" --save_model="$dir/final.safetensors" \
      >"$dir/w$r.log" 2>&1 &
    _started+=($!)
    workers[$r]=$!
  done
  if [[ -n "$kill_shards" ]]; then
    # Shard 0 after its checkpoint of step 21, shard 1 after step 105 (epoch 2): both
    # mid-epoch, each between two checkpoints.
    for plan in "0 21" "1 105"; do
      read -r s after <<<"$plan"
      local want
      want=$(printf "%s/ckpt%d/shard-%d-step-%012d.safetensors" "$dir" "$s" "$s" "$after")
      # Killed as soon as that checkpoint is seen: a fast machine runs a step in ~3 ms, so
      # any wait here (there was a 0.3 s one) can let the job finish before the kill. The
      # workers are then at or past step $after; shard 1's newest checkpoint is truncated
      # below, so its restart always sends them back.
      for _ in $(seq 6000); do
        [[ -f "$want" ]] && break
        kill -0 "${workers[0]}" 2>/dev/null ||
          die "worker 0 ended before shard $s was killed: $(tail -n 5 "$dir"/w*.log "$SCRATCH"/shard*.log)"
        sleep 0.01
      done
      [[ -f "$want" ]] || die "no checkpoint of step $after from shard $s"
      kill -KILL "${pids[$s]}"
      wait "${pids[$s]}" 2>/dev/null || true
      echo "killed shard $s after its checkpoint of step $after"
      mv "$SCRATCH/shard$s.log" "$dir/shard$s.first.log"
      if ((s == 1)); then
        newest=$(ls "$dir/ckpt1"/shard-1-step-*.safetensors | sort | tail -n 1)
        truncate -s $(($(stat -c %s "$newest") / 2)) "$newest"
        echo "truncated $(basename "$newest")"
      fi
      sleep 1
      start_shard $s 2 2 "${shard_flags[@]}" --checkpoint_dir="$dir/ckpt$s" --port="${ports[$s]}"
      pids[$s]=${_started[-1]}
      grep -q "restored step" "$SCRATCH/shard$s.log" || sleep 0.5
      grep "restored step" "$SCRATCH/shard$s.log" || die "shard $s did not restore: $(cat "$SCRATCH/shard$s.log")"
      if ((s == 1)); then
        grep "skipping checkpoint of step" "$SCRATCH/shard1.log" ||
          die "shard 1 did not report its truncated checkpoint: $(cat "$SCRATCH/shard1.log")"
      fi
    done
  fi
  for r in 0 1; do
    wait "${workers[$r]}" || die "$name: worker $r failed: $(tail -n 5 "$dir/w$r.log")"
  done
  "$ROOT/server/ps_status" --ps="$ps" >"$dir/status.txt" || die "ps_status: $(cat "$dir/status.txt")"
  for s in 0 1; do cp "$SCRATCH/shard$s.log" "$dir/shard$s.log"; kill -TERM "${pids[$s]}"; done
}

declare -a pids workers
run_job reference
run_job crashed kill
grep -h "recover" "$SCRATCH"/crashed/w*.log
grep -q "recovered by going back to step" "$SCRATCH/crashed/w0.log" ||
  die "worker 0 never went back: $(cat "$SCRATCH/crashed/w0.log")"
grep -q "went back to the checkpoint" "$SCRATCH"/crashed/shard*.log ||
  die "no shard was rolled back to the restarted one's step"
# Each restart sent the job back at most once (shard 0's may need none: restored at the step
# the workers were at): the second rank joined the incarnation the first opened instead of
# opening another, and ps_status says so, the same on both shards.
cat "$SCRATCH/crashed/status.txt"
incarnations=$(grep -o "incarnation [0-9]* from step [0-9]*" "$SCRATCH/crashed/status.txt" | sort -u)
[[ $(grep -c "incarnation [12] from step" "$SCRATCH/crashed/status.txt") == 2 &&
   $(wc -l <<<"$incarnations") == 1 ]] ||
  die "the shards are not both in incarnation 1 or 2, the same: $(cat "$SCRATCH/crashed/status.txt")"
! grep -q "incarnation" "$SCRATCH/reference/status.txt" || die "the reference job went back"
cmp "$SCRATCH/reference/final.safetensors" "$SCRATCH/crashed/final.safetensors" ||
  die "the weights after two shard crashes differ from the uninterrupted run"
echo "final weights bit-identical ($(stat -c %s "$SCRATCH/crashed/final.safetensors") bytes)"

# Without a checkpoint the model is gone: the workers say so and exit non-zero (no hang).
start_shard 0 1 1 --step_timeout=5s
port=$SHARD_PORT
lone=${_started[-1]}
"$GPU_WORKER" --rank=0 --world_size=1 --ps="127.0.0.1:$port" --model=mlp --epochs=50 \
  --batch_size=32 --threads=1 --reconnect_timeout=20s --test_subset=100 --data_dir="$DATA_DIR" \
  >"$SCRATCH/lone.log" 2>&1 &
w=$!
_started+=($w)
for _ in $(seq 300); do grep -q "epoch 1/50" "$SCRATCH/lone.log" && break; sleep 0.1; done
kill -KILL $lone
sleep 0.5
start_shard 0 1 1 --step_timeout=5s --port="$port"
set +e
wait $w
rc=$?
set -e
((rc != 0)) || die "the worker went on with a shard that lost the model"
grep -q "came back without the model" "$SCRATCH/lone.log" ||
  die "unclear message: $(tail -n 3 "$SCRATCH/lone.log")"
echo PASS
