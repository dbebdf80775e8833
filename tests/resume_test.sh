#!/usr/bin/env bash
# resume_test.sh [MODE]: MODE master (default), allreduce or allreduce_replicas. Rank 0 saves a
# checkpoint every --save_every steps (master: its reducer's shard; allreduce: the weights, the
# ring's sharded optimizer state gathered from every rank, and the step; allreduce_replicas,
# --sharded_optimizer=false: the optimizer state rank 0's replica applied itself, the same on
# every rank); after every worker is killed
# (kill -9), the job restarted with --resume continues from the newest one and ends with
# weights bit-identical to the uninterrupted run (the data order is a function of the step).
# Without --resume, a --save_dir holding checkpoints is refused; with it, an empty one is.
# DPTRAIN_WORKER_FLAGS: more flags for every worker (tools/gpu/check.sh: --device=cuda
# --deterministic, the GPU replicas' optimizer state in the checkpoints).
source "$(dirname "$0")/testlib.sh"
need_data
mode=${1:-master}
extra=()
case $mode in
  master) subdir=master ;;
  allreduce) subdir=ring ;;
  allreduce_replicas) subdir=ring; mode=allreduce; extra=(--sharded_optimizer=false) ;;
  *) die "unknown mode '$mode'" ;;
esac

read -r -a from_env <<<"${DPTRAIN_WORKER_FLAGS:-}"
common=("${extra[@]}" "${from_env[@]}" --mode="$mode" --world_size=2 --epochs=3 --threads=1 --seed=5 --lr=0.05 --momentum=0.9
        --master_addr=127.0.0.1 --advertise_host=127.0.0.1 --bind_address=127.0.0.1
        --step_timeout=20s --data_dir="$DATA_DIR")
flags=("${common[@]}" --model=lenet --batch_size=32 --max_steps_per_epoch=50 --test_subset=300)

# run NAME [EXTRA FLAGS...]: starts ranks 0 and 1; sets W0 W1.
run() {
  local name=$1
  shift
  rm -f "$SCRATCH/$name.port"
  "$GPU_WORKER" --rank=0 --master_port=0 --port_file="$SCRATCH/$name.port" "${flags[@]}" "$@" \
    >>"$SCRATCH/$name.w0.log" 2>&1 &
  W0=$!
  _started+=($W0)
  for _ in $(seq 200); do [[ -s "$SCRATCH/$name.port" ]] && break; sleep 0.05; done
  [[ -s "$SCRATCH/$name.port" ]] || die "$name: rank 0 did not listen: $(tail -n 3 "$SCRATCH/$name.w0.log")"
  "$GPU_WORKER" --rank=1 --master_port="$(cat "$SCRATCH/$name.port")" "${flags[@]}" "$@" \
    >>"$SCRATCH/$name.w1.log" 2>&1 &
  W1=$!
  _started+=($W1)
}

run reference --save_model="$SCRATCH/reference.safetensors"
wait $W0 || die "reference rank 0 failed: $(tail -n 3 "$SCRATCH/reference.w0.log")"
wait $W1 || die "reference rank 1 failed"

save=(--save_dir="$SCRATCH/saves" --save_every=10 --save_model="$SCRATCH/resumed.safetensors")
run resumed "${save[@]}"
want="$SCRATCH/saves/$subdir/shard-0-step-000000000060.safetensors"
# Killed as soon as the checkpoint is seen, 90 of the 150 steps still to go (a fast machine
# runs a step in ~2 ms, so a wait here could let the job end first).
for _ in $(seq 6000); do [[ -f "$want" ]] && break; sleep 0.01; done
[[ -f "$want" ]] || die "no checkpoint of step 60: $(ls "$SCRATCH/saves/$subdir" 2>&1)"
kill -0 $W0 2>/dev/null && kill -0 $W1 2>/dev/null ||
  die "the job ended before its workers could be killed: $(tail -n 2 "$SCRATCH/resumed.w0.log")"
kill -KILL $W0 $W1
wait $W0 $W1 2>/dev/null || true
echo "killed both workers after the checkpoint of step 60 (epoch 2)"

set +e
"$GPU_WORKER" --rank=0 --master_port=0 "${flags[@]}" "${save[@]}" >"$SCRATCH/refused.w0.log" 2>&1
rc=$?
set -e
((rc != 0)) || die "a --save_dir with checkpoints was reused without --resume"
grep -q "pass --resume" "$SCRATCH/refused.w0.log" || die "unclear: $(tail -n 2 "$SCRATCH/refused.w0.log")"
set +e
"$GPU_WORKER" --rank=0 --master_port=0 "${flags[@]}" --save_dir="$SCRATCH/empty" --resume \
  >"$SCRATCH/empty.w0.log" 2>&1
rc=$?
set -e
((rc != 0)) || die "--resume with no checkpoint was accepted"
grep -q "holds no checkpoint" "$SCRATCH/empty.w0.log" || die "unclear: $(tail -n 2 "$SCRATCH/empty.w0.log")"

run resumed "${save[@]}" --resume
wait $W0 || die "resumed rank 0 failed: $(tail -n 3 "$SCRATCH/resumed.w0.log")"
wait $W1 || die "resumed rank 1 failed: $(tail -n 3 "$SCRATCH/resumed.w1.log")"
grep -h "joins the job at step\|restored step" "$SCRATCH"/resumed.w*.log
grep -q "rank 1 joins the job at step [1-9][0-9]* (" "$SCRATCH/resumed.w1.log" ||
  die "rank 1 did not resume mid-job (steps 10-149 of 150)"
cmp "$SCRATCH/reference.safetensors" "$SCRATCH/resumed.safetensors" ||
  die "the resumed job's weights differ from the uninterrupted run"
echo "final weights bit-identical after a kill of every worker and --resume"

# Batch norm (resnet18, tiny): the checkpoint holds every rank's running statistics (master:
# each worker hands its own to the reducer at a checkpoint step; allreduce: rank 0 gathers
# them). 3 epochs of 2 steps with a checkpoint every step (the newest 3 kept: steps 4, 5, 6).
# Resumed from step 5 (mid-epoch: the ranks' statistics differ until the epoch's average)
# and from step 4 (the start of epoch 3: the average of epoch 2's), each time from a folder
# holding that checkpoint alone: final weights and statistics must match the uninterrupted
# run. Without the statistics both fail (checked by hand).
flags=("${common[@]}" --epochs=3 --model=resnet18 --batch_size=4 --max_steps_per_epoch=2 --test_subset=8)
run bn_reference --save_dir="$SCRATCH/bn_saves" --save_every=1 \
  --save_model="$SCRATCH/bn_reference.safetensors"
wait $W0 || die "bn reference rank 0 failed: $(tail -n 3 "$SCRATCH/bn_reference.w0.log")"
wait $W1 || die "bn reference rank 1 failed"
for from in 5 4; do
  mkdir -p "$SCRATCH/bn_resume$from/$subdir"
  cp "$SCRATCH/bn_saves/$subdir/shard-0-step-00000000000$from.safetensors" "$SCRATCH/bn_resume$from/$subdir/"
  run "bn_resumed$from" --save_dir="$SCRATCH/bn_resume$from" --save_every=1 --resume \
    --save_model="$SCRATCH/bn_resumed$from.safetensors"
  wait $W0 || die "bn resumed rank 0 failed: $(tail -n 3 "$SCRATCH/bn_resumed$from.w0.log")"
  wait $W1 || die "bn resumed rank 1 failed: $(tail -n 3 "$SCRATCH/bn_resumed$from.w1.log")"
  grep -q "rank 1 joins the job at step $from" "$SCRATCH/bn_resumed$from.w1.log" ||
    die "bn: no resume at step $from: $(tail -n 3 "$SCRATCH/bn_resumed$from.w1.log")"
  cmp "$SCRATCH/bn_reference.safetensors" "$SCRATCH/bn_resumed$from.safetensors" ||
    die "resnet18 resumed at step $from differs from the uninterrupted run (batch-norm statistics?)"
  echo "resnet18 resumed at step $from: weights and batch-norm statistics bit-identical"
done
echo PASS
