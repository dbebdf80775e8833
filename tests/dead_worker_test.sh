#!/usr/bin/env bash
# Kill one worker mid-training: the other must exit non-zero within --step_timeout plus a few
# seconds, with a message that names the missing rank.
source "$(dirname "$0")/testlib.sh"
need_data

start_shard 0 2 2 --step_timeout=3s
p0=$SHARD_PORT
start_shard 1 2 2 --step_timeout=3s
p1=$SHARD_PORT
ps="127.0.0.1:$p0,127.0.0.1:$p1"
common=(--ps="$ps" --world_size=2 --model=mlp --epochs=100 --batch_size=64 --threads=1
        --data_dir="$DATA_DIR")
"$GPU_WORKER" --rank=0 "${common[@]}" >"$SCRATCH/w0.log" 2>&1 &
w0=$!
_started+=($w0)
"$GPU_WORKER" --rank=1 "${common[@]}" >"$SCRATCH/w1.log" 2>&1 &
w1=$!
_started+=($w1)

# Wait until training is under way (the first epoch line), then kill rank 1.
for _ in $(seq 600); do
  grep -q "epoch 1/100" "$SCRATCH/w0.log" 2>/dev/null && break
  kill -0 $w0 2>/dev/null || die "worker 0 ended early: $(cat "$SCRATCH/w0.log")"
  sleep 0.1
done
grep -q "epoch 1/100" "$SCRATCH/w0.log" || die "training did not start"
kill -KILL $w1
killed_at=$(date +%s.%N)

set +e
wait $w0
rc=$?
set -e
elapsed=$(echo "$(date +%s.%N) - $killed_at" | bc)
echo "worker 0 exited with $rc after ${elapsed}s"
cat "$SCRATCH/w0.log" | tail -n 3
((rc != 0)) || die "worker 0 exited 0 after its peer died"
grep -q "timed out waiting for rank(s) 1" "$SCRATCH/w0.log" || die "message does not name rank 1"
awk -v e="$elapsed" 'BEGIN { exit !(e <= 3 + 5) }' || die "took ${elapsed}s (> step_timeout + 5s)"

# The same in allreduce mode: the survivor's ring neighbour vanished.
common=(--mode=allreduce --world_size=2 --lr=0.1 --model=mlp --epochs=100 --batch_size=64
        --threads=1 --step_timeout=3s --advertise_host=127.0.0.1 --data_dir="$DATA_DIR")
"$GPU_WORKER" --rank=0 --master_port=0 --port_file="$SCRATCH/master.port" "${common[@]}" \
  >"$SCRATCH/a0.log" 2>&1 &
a0=$!
_started+=($a0)
for _ in $(seq 100); do [[ -s "$SCRATCH/master.port" ]] && break; sleep 0.1; done
"$GPU_WORKER" --rank=1 --master_port="$(cat "$SCRATCH/master.port")" "${common[@]}" \
  >"$SCRATCH/a1.log" 2>&1 &
a1=$!
_started+=($a1)
for _ in $(seq 600); do
  grep -q "epoch 1/100" "$SCRATCH/a0.log" 2>/dev/null && break
  kill -0 $a0 2>/dev/null || die "allreduce worker 0 ended early: $(cat "$SCRATCH/a0.log")"
  sleep 0.1
done
kill -KILL $a1
killed_at=$(date +%s.%N)
set +e
wait $a0
rc=$?
set -e
elapsed=$(echo "$(date +%s.%N) - $killed_at" | bc)
echo "allreduce worker 0 exited with $rc after ${elapsed}s: $(tail -n 1 "$SCRATCH/a0.log")"
((rc != 0)) || die "allreduce worker 0 exited 0 after its peer died"
grep -q "rank 1" "$SCRATCH/a0.log" || die "allreduce message does not name rank 1"
awk -v e="$elapsed" 'BEGIN { exit !(e <= 3 + 5) }' || die "took ${elapsed}s (> step_timeout + 5s)"
echo PASS
