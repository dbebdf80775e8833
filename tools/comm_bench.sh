#!/usr/bin/env bash
# Builds and runs the communication benchmark, then the peers (torch.distributed gloo,
# iperf3) in the same run, and appends them to the report.
# usage: tools/comm_bench.sh [OUT_DIR] [comm_benchmark flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-results/comm}"
shift || true
tools/setup.sh
# The single-TCP-stream reference (benchmark only, so not in setup.sh); best effort.
if ! command -v iperf3 >/dev/null; then
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo=sudo
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq iperf3 >/dev/null 2>&1 ||
    echo "comm_bench: iperf3 not installable; its row will say so" >&2
fi
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
