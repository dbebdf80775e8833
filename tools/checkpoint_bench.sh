#!/usr/bin/env bash
# Shard checkpoint cost for a real model: one ps_server shard holding all of ResNet-18 (SGD
# with momentum, so the checkpoint carries the weights and the momentum buffer) writes a
# checkpoint after every step of a short CPU run; prints the file size and the write time of
# each checkpoint (ps_server's own measurement, GetShardInfo checkpoint_seconds), median.
# usage: tools/checkpoint_bench.sh [STEPS=5] [MODEL=resnet18]   (after bazel build //...)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-5}
model=${2:-resnet18}
dir=$(mktemp -d -t dptrain-ckpt-bench.XXXXXX)
trap 'kill $shard 2>/dev/null || true; rm -rf "$dir"' EXIT
bazel-bin/server/ps_server --host=127.0.0.1 --port=0 --port_file="$dir/port" --num_workers=1 \
  --momentum=0.9 --checkpoint_dir="$dir/ckpt" --checkpoint_every=1 --checkpoint_keep=$((steps + 1)) \
  >"$dir/shard.log" 2>&1 &
shard=$!
for _ in $(seq 100); do [[ -s "$dir/port" ]] && break; sleep 0.1; done
bazel-bin/worker/gpu_worker --ps="127.0.0.1:$(cat "$dir/port")" --model="$model" --epochs=1 \
  --max_steps_per_epoch="$steps" --batch_size=16 --test_subset=16 --device=cpu \
  --lr=0.1 >"$dir/worker.log" 2>&1
ls -l "$dir/ckpt" | awk 'NR > 1 { print "  " $9 "  " $5 " bytes" }'
kill -TERM $shard
wait $shard || true
grep "checkpoints written" "$dir/shard.log" | sed 's/.*checkpoints written/checkpoints written/'
