#!/usr/bin/env bash
# Builds and runs the communication benchmark, then the peers (torch.distributed gloo,
# iperf3) in the same run, and appends them to the report.
# usage: tools/comm_bench.sh [OUT_DIR] [comm_benchmark flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-results/comm}"
shift || true
tools/setup.sh
bazel build //tests/bench:comm_benchmark
mkdir -p "$out"
bazel-bin/tests/bench/comm_benchmark --out="$out" "$@"
{
  echo
  echo "## Peers on this machine, same run"
  echo
  echo "| peer | ranks | size | time ms | busbw GB/s |"
  echo "|---|---|---|---|---|"
  /usr/bin/python3 tools/bench_peers.py
} | tee -a "$out/comm.md"
