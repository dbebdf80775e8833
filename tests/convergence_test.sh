#!/usr/bin/env bash
# Training really learns, with the real binaries through 2 shards and 2 workers:
#   lenet (d2l) on Fashion-MNIST for 10 epochs reaches test accuracy >= 0.80;
#   resnet18 (d2l) on a 4,096-image training subset gets well above chance (>= 0.2 on
#   1,000 test images; chance is 0.1; measured 0.33) within one pass of 32 steps.
# Each run is a few minutes on 2 cores: run as `bazel test //tests:convergence_test`.
source "$(dirname "$0")/testlib.sh"
need_data

# train NAME MIN_ACC LAUNCHER_FLAGS... -- WORKER_FLAGS...
train() {
  local name=$1 min_acc=$2
  shift 2
  "$LAUNCHER" --bin="$ROOT" --shards=2 --workers=2 --logs="$SCRATCH/$name" "$@" \
    >"$SCRATCH/$name.txt" 2>&1 || die "$name: $(tail -n 20 "$SCRATCH/$name.txt")"
  grep -h " done:" "$SCRATCH/$name/worker0.log"
  for r in 0 1; do
    local acc
    acc=$(json_field "$SCRATCH/$name/worker$r.jsonl" final test_acc)
    awk -v a="$acc" -v m="$min_acc" 'BEGIN { exit !(a >= m) }' ||
      die "$name: worker $r test accuracy $acc < $min_acc"
  done
}

# lr 0.1 with momentum 0.9 (d2l's plain lr 0.9 measured 0.7985 after 10 epochs here).
train lenet 0.80 --lr=0.1 --momentum=0.9 -- --model=lenet --epochs=10 --batch_size=128 \
  --threads=1 --data_dir="$DATA_DIR"
train resnet18 0.2 --lr=0.05 --momentum=0.9 -- --model=resnet18 --epochs=1 --batch_size=64 \
  --threads=1 --train_subset=4096 --test_subset=1000 --data_dir="$DATA_DIR"
echo PASS
