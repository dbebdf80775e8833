#!/usr/bin/env bash
# Builds and runs the communication benchmark, then the peers (torch.distributed gloo,
# iperf3, then Open MPI over TCP and the Gloo library: tools/bench_native_peers.sh) in the
# same run, and appends them to the report.
# Last, tools/head_to_head.py: our ring against every peer, and the PS against one TCP
# stream, in interleaved rounds (H2H_ROUNDS, default 3), medians.
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
# The native peers (tools/bench_native_peers.sh): Open MPI and the Gloo library; best effort,
# apt-get update only when a package is not found.
if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null ||
    [[ ! -e /usr/include/gloo/allreduce.h ]]; then
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo=sudo
  peer_pkgs=(openmpi-bin libopenmpi-dev libgloo-dev)
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${peer_pkgs[@]}" >/dev/null 2>&1 ||
    { $sudo apt-get update -qq >/dev/null 2>&1 &&
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${peer_pkgs[@]}" \
        >/dev/null 2>&1; } ||
    echo "comm_bench: Open MPI / Gloo not installable; their rows will say so" >&2
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
  tools/bench_native_peers.sh "$out/peers-build"
  echo
  echo "## Head to head (interleaved rounds)"
  echo
  /usr/bin/python3 tools/head_to_head.py --out="$out" --rounds="${H2H_ROUNDS:-3}"
} | tee -a "$out/comm.md"
