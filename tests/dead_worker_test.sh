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
echo PASS
