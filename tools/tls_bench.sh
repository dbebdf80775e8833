#!/usr/bin/env bash
# What mutual TLS and the job token cost a ps-mode job on this machine: the same job
# (deploy/local_cluster.sh, ps mode, 1 shard, 2 CPU workers of 128 images, MODEL) in
# plaintext and with --certs (tools/make_certs.sh), interleaved ROUNDS times; job images/s =
# the sum of the 2 ranks' last-epoch rates, and the bytes each worker pushed and pulled. mlp
# (the default) moves 0.8 MB each way per step for little compute, so TLS's share shows most.
# usage: tools/tls_bench.sh [ROUNDS=5] [MODEL=mlp] [EPOCHS=2]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5} model=${2:-mlp} epochs=${3:-2}
bazel build //worker:gpu_worker //server:ps_server >/dev/null 2>&1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tools/make_certs.sh --shards=1 --workers=2 "$work/certs" >/dev/null

# The job images/s and MB moved per worker of the run whose logs are in $1.
measure() {
  local total=0 mb=""
  for r in 0 1; do
    local rate
    rate=$(grep -oE "epoch [0-9]+/[0-9]+ .* images/s [0-9]+" "$1/worker$r.log" | tail -1 |
      grep -oE "[0-9]+$")
    total=$((total + rate))
    mb=$(grep -oE "pushed [0-9.]+ MB, pulled [0-9.]+ MB" "$1/worker$r.log" | tail -1)
  done
  echo "$total $mb"
}

echo "tls_bench: ps mode, 1 shard, 2 workers x 128 images, $model, $epochs epochs, $rounds rounds"
echo "start load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$rounds"); do
  for how in plain tls; do
    extra=()
    [[ $how == tls ]] && extra=(--certs="$work/certs")
    logs="$work/$how-$r"
    if ! deploy/local_cluster.sh --mode=ps --shards=1 --workers=2 --lr=0.1 --logs="$logs" \
      "${extra[@]}" -- --model="$model" --epochs="$epochs" --batch_size=128 \
      --test_subset=256 --device=cpu >"$work/out" 2>&1; then
      echo "tls_bench: the $how job failed:" >&2
      tail -20 "$work/out" >&2
      exit 1
    fi
    read -r rate rest < <(measure "$logs")
    echo "round $r $how $rate images/s ($rest per worker)"
    echo "$how $rate" >>"$work/rates"
  done
done
echo "end load average: $(cut -d' ' -f1-3 /proc/loadavg)"
median() { grep "^$1 " "$work/rates" | cut -d' ' -f2 | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
plain=$(median plain) tls=$(median tls)
echo "median job images/s: plaintext $plain, TLS + token $tls, TLS / plaintext $(awk -v a="$tls" -v b="$plain" 'BEGIN {printf "%.2f", a / b}')"
