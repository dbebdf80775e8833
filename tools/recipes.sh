#!/usr/bin/env bash
# docs/benchmarks/recipes.md: one run per optimizer through deploy/local_cluster.sh (allreduce
# mode, 2 workers, mlp, 5 epochs of Fashion-MNIST, batch 256 per worker), printing each
# recipe's final line. Build first (bazel build //...).
#   tools/recipes.sh [BIN_DIR]   (default: bazel-bin)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-bazel-bin}
# 2 workers x 256 = 512 images per step: 117 steps per epoch (the last partial batch of each
# worker's 30,000 included: 118), 590 steps in 5 epochs.
recipes=(
  "sgd+momentum|--lr=0.1 --momentum=0.9|"
  "adam|--lr=0.001|--optimizer=adam"
  "adamw+warmup+cosine, lr x workers|--lr=0.001|--optimizer=adamw --weight_decay=0.01 --lr_schedule=cosine --warmup_steps=50 --lr_total_steps=590 --scale_lr"
)
for recipe in "${recipes[@]}"; do
  IFS='|' read -r name launcher_flags worker_flags <<<"$recipe"
  logs=$(mktemp -d)
  # shellcheck disable=SC2086  # The flag lists are split on purpose.
  deploy/local_cluster.sh --bin="$bin" --mode=allreduce --workers=2 $launcher_flags --logs="$logs" \
    -- --model=mlp --epochs=5 --threads=1 --log_every=0 $worker_flags >"$logs/out.txt" 2>&1 ||
    { echo "recipes: $name failed: $(tail -3 "$logs/out.txt")" >&2; exit 1; }
  echo "$name ($launcher_flags $worker_flags): $(grep -h -m1 'rank 0 done' "$logs/worker0.log" | sed 's/.*done: //')"
  rm -rf "$logs"
done
