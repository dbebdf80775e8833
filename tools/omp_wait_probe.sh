#!/bin/bash
# Does oneDNN's OpenMP spin-wait cost the 2-thread training step? Times compute_benchmark's step
# (lenet, resnet18, --threads=2) with --conv=im2col (no OpenMP: the control) and --conv=onednn,
# each with libgomp's default wait policy and with OMP_WAIT_POLICY=passive (read when the process
# starts, so set per process), interleaved, ROUNDS rounds. Output: one line per point.
# Usage: tools/omp_wait_probe.sh [ROUNDS]   (after bazel build //tests/bench:compute_benchmark)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
bench=bazel-bin/tests/bench/compute_benchmark
for r in $(seq 1 "$rounds"); do
  for conv in im2col onednn; do
    for policy in default passive; do
      if [[ "$policy" == default ]]; then
        out=$(env -u OMP_WAIT_POLICY "$bench" --models=lenet,resnet18 --threads=2 --conv="$conv" \
          --warmup=3 --steps=15)
      else
        out=$(OMP_WAIT_POLICY=passive "$bench" --models=lenet,resnet18 --threads=2 \
          --conv="$conv" --warmup=3 --steps=15)
      fi
      # The table rows: | model | threads | step ms | ...
      grep -E '^\| (lenet|resnet18) ' <<<"$out" |
        awk -F'|' -v r="$r" -v c="$conv" -v p="$policy" \
          '{gsub(/ /, "", $2); gsub(/ /, "", $4); print "round " r " conv " c " policy " p " model " $2 " step_ms " $4}'
    done
  done
done
