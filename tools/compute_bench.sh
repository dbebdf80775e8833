#!/usr/bin/env bash
# CPU training head to head, ours against Debian's PyTorch in its fastest configuration on this
# machine (OpenMP OpenBLAS, set_num_threads = cores; its 1-thread and default-environment runs
# beside it): end-to-end training images/s of one worker at default flags and of the step
# alone, for mlp, lenet and resnet18; then 2 workers on one box (allreduce, ps) against PyTorch
# DDP with gloo. Ours and theirs interleaved, each point in a fresh process, medians of the
# rounds, load averages recorded (tools/compute_head_to_head.py does the measuring); it waits
# for a quiet machine, checks before every point that no other job uses the cores, and exits
# 3 with a "NOT QUIET" report when one did: only a quiet run's figures go to the README.
# Writes OUT_DIR/compute.md and raw.jsonl.
# usage: tools/compute_bench.sh [OUT_DIR] [--rounds=3] [--resnet18_rounds=1]
#          [--models=mlp,lenet,resnet18] [--two_worker_models=mlp,lenet] [--dense_models=mlp,lenet]
# Installs python3-torch and libopenblas0-openmp if missing. On 2 cores a default run takes ~15 minutes, mostly resnet18 and PyTorch's slow points.
set -euo pipefail
cd "$(dirname "$0")/.."
out="results/compute"
if [[ $# -gt 0 && "$1" != --* ]]; then
  out="$1"
  shift
fi
tools/setup.sh
bazel build //tests/bench:compute_benchmark //worker:gpu_worker //server:ps_server
# The peer, from Debian: PyTorch, and OpenBLAS's OpenMP build, which PyTorch is fastest with
# (selected for its processes only, by LD_LIBRARY_PATH; installing it leaves the system's
# libblas.so.3 on the pthread build, whose alternative has the higher priority).
extras=()
/usr/bin/python3 -c 'import torch' 2>/dev/null || extras+=(python3-torch)
[[ -e /usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3 ]] || extras+=(libopenblas0-openmp)
if ((${#extras[@]})); then
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo=sudo
  echo "compute_bench.sh: installing ${extras[*]}"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${extras[@]}" >/dev/null
fi
rm -f "$out/raw.jsonl"
exec /usr/bin/python3 tools/compute_head_to_head.py --out="$out" "$@"
