#!/usr/bin/env bash
# The three modes on a network instead of loopback: every worker and every PS shard in its
# own network namespace with its own link (a veth into a bridge), each link limited to RATE
# in both directions (tbf), so that a link's bytes cost wire time as on a real cluster and
# shards on their own hosts add bandwidth (on loopback they share the same two cores).
# Times one synchronisation of a SIZE-MiB gradient among N=4 worker processes
# (tests/bench/comm_probe, median of REPS) for:
#   master  - one reducer on worker 0's host (the DataParallel layout: its link carries
#             the other workers' N-1 gradients in and N-1 weight copies out),
#   ps S=2  - two shards on hosts of their own,  ps S=4 - four,
#   ring    - ring all-reduce among the workers,
# and prints a Markdown table with the wire time the busiest link needs at RATE.
# Needs root (network namespaces, tc); builds with Bazel first.
# usage: tools/netns_modes_bench.sh [RATE=1gbit] [SIZE_MIB=16] [REPS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
rate="${1:-1gbit}"
size="${2:-16}"
reps="${3:-3}"
bazel build //server:ps_server //tests/bench:comm_probe //deploy:health_probe >/dev/null 2>&1 ||
  bazel build //server:ps_server //tests/bench:comm_probe //deploy:health_probe
PS_SERVER="$PWD/bazel-bin/server/ps_server"
PROBE="$PWD/bazel-bin/tests/bench/comm_probe"
HEALTH="$PWD/bazel-bin/deploy/health_probe"
N=4
PORT=50051
P="dptb$$"
SW="$P-sw"
NODES=(w0 w1 w2 w3 s0 s1 s2 s3)
declare -A IP=([w0]=10.78.0.21 [w1]=10.78.0.22 [w2]=10.78.0.23 [w3]=10.78.0.24
               [s0]=10.78.0.11 [s1]=10.78.0.12 [s2]=10.78.0.13 [s3]=10.78.0.14)
created=()
pids=()
source tests/netns_lib.sh
trap netns_cleanup EXIT
trap 'exit 130' INT TERM
die() { echo "netns_modes_bench: $*" >&2; exit 1; }

netns_switch "$P" || die "cannot create network namespaces ($NETNS_ERROR; needs root)"
for n in "${NODES[@]}"; do
  netns_host "$P" "$n"
  # Both directions of the host's link: its eth0 (out) and the switch side (in).
  ip netns exec "$P-$n" tc qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 50ms
  ip netns exec "$SW" tc qdisc add dev "v-$n" root tbf rate "$rate" burst 256kb latency 50ms
done
scratch=$(mktemp -d)
trap 'netns_cleanup; rm -rf "$scratch"' EXIT

# start_shards NUM_SHARDS HOST...: one ps_server per host; waits until each is SERVING.
start_shards() {
  local num=$1 s
  shift
  local hosts=("$@")
  for s in $(seq 0 $((num - 1))); do
    ip netns exec "$P-${hosts[$s]}" "$PS_SERVER" --host="${IP[${hosts[$s]}]}" --port=$PORT \
      --shard="$s" --num_shards="$num" --num_workers=$N --lr=0.000001 --step_timeout=120s \
      >"$scratch/shard$s.log" 2>&1 &
    pids+=($!)
  done
  for s in $(seq 0 $((num - 1))); do
    for _ in $(seq 100); do
      ip netns exec "$P-w1" "$HEALTH" --addr="${IP[${hosts[$s]}]}:$PORT" --timeout=1s \
        >/dev/null 2>&1 && continue 2
      sleep 0.1
    done
    die "shard $s on ${hosts[$s]} not SERVING: $(cat "$scratch/shard$s.log")"
  done
}

stop_all() {
  local pid
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
}

# probes NAME FLAGS...: comm_probe on every worker host; rank 0's median seconds in $t.
probes() {
  local name=$1 r ps=()
  shift
  for r in $(seq 0 $((N - 1))); do
    ip netns exec "$P-w$r" "$PROBE" --rank="$r" --world_size=$N --size_mib="$size" \
      --reps="$reps" --advertise_host="${IP[w$r]}" "$@" >"$scratch/$name.$r.json" 2>"$scratch/$name.$r.err" &
    ps+=($!)
    pids+=($!)
  done
  for r in $(seq 0 $((N - 1))); do
    wait "${ps[$r]}" || die "$name: rank $r failed: $(cat "$scratch/$name.$r.err")"
  done
  t=$(sed -n 's/.*"median_s":\([0-9.e-]*\).*/\1/p' "$scratch/$name.0.json")
}

bytes=$((size << 20))
rate_bps=$(awk -v r="$rate" 'BEGIN { m = r; sub(/[a-z]+$/, "", m);
  u = r; sub(/^[0-9.]+/, "", u); f = (u == "gbit") ? 1e9 : (u == "mbit") ? 1e6 : 1;
  print m * f / 8 }')
wire() { awk -v b="$1" -v r="$rate_bps" 'BEGIN { printf "%.1f", b / r * 1e3 }'; }
declare -a rows

start_shards 1 w0
probes master --mode=ps --ps="${IP[w0]}:$PORT"
stop_all
# The reducer's link: N-1 gradients in, N-1 weight copies out.
rows+=("| master (reducer on worker 0) | $(awk -v t="$t" 'BEGIN{printf "%.1f", t*1e3}') | $(wire $(((N - 1) * bytes))) | (N-1)·K |")

start_shards 2 s0 s1
probes ps2 --mode=ps --ps="${IP[s0]}:$PORT,${IP[s1]}:$PORT"
stop_all
rows+=("| ps S=2 (own hosts) | $(awk -v t="$t" 'BEGIN{printf "%.1f", t*1e3}') | $(wire $((N * bytes / 2))) | N·K/S |")

start_shards 4 s0 s1 s2 s3
probes ps4 --mode=ps --ps="${IP[s0]}:$PORT,${IP[s1]}:$PORT,${IP[s2]}:$PORT,${IP[s3]}:$PORT"
stop_all
rows+=("| ps S=4 (own hosts) | $(awk -v t="$t" 'BEGIN{printf "%.1f", t*1e3}') | $(wire $((N * bytes / 4))) | N·K/S = K |")

probes ring --mode=allreduce --master_addr="${IP[w0]}" --master_port=$PORT
stop_all
rows+=("| ring all-reduce | $(awk -v t="$t" 'BEGIN{printf "%.1f", t*1e3}') | $(wire $((2 * (N - 1) * bytes / N))) | 2(N-1)/N·K |")

echo "N=$N workers, $size MiB fp32 gradient, every host's link limited to $rate each way" \
  "(tbf), median of $reps synchronisations, rank 0's time:"
echo
echo "| mode | time ms | wire time of the busiest link ms | busiest link carries (each way) |"
echo "|---|---|---|---|"
printf '%s\n' "${rows[@]}"
