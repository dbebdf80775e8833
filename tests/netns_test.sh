#!/usr/bin/env bash
# A multi-host run on one machine: every shard and every worker in its own network namespace
# with its own address on a private 10.77.0.0/24, all joined by veth pairs to a bridge that
# lives in a "switch" namespace of its own (nothing is added to the machine's own network).
#  1. 2 shards + 2 workers, the flags of deploy/k8s and deploy/docker-compose.yml, mlp, one
#     epoch of Fashion-MNIST: test accuracy >= 0.75 on both ranks, and the bytes really went
#     through the bridge (veth counters).
#  2. Short runs (--max_steps_per_epoch=20) without and with a link limit on every veth, both
#     directions: netem delay 1ms + rate 1gbit where the kernel has sch_netem, else tbf 1gbit
#     (no delay); prints images/s of both.
# Needs root (CAP_NET_ADMIN, /run/netns): prints "SKIPPED: ..." and passes without it.
# Namespace names carry $$, so concurrent runs do not collide; a trap removes everything.
source "$(dirname "$0")/testlib.sh"
HEALTH_PROBE="$ROOT/deploy/health_probe"
COMM_PROBE="$ROOT/tests/bench/comm_probe"
need_data

P="dpt$$-$RANDOM"                           # namespace prefix, unique per run
SW="$P-sw"                                  # the switch: holds the bridge
NODES=(ps0 ps1 w0 w1)
declare -A IP=([ps0]=10.77.0.11 [ps1]=10.77.0.12 [w0]=10.77.0.21 [w1]=10.77.0.22)
PORT=50051                                  # fixed, as in the manifests: each host is its own
created=()
pids=()

source "$ROOT/tests/netns_lib.sh"
trap netns_cleanup EXIT
trap 'exit 130' INT TERM

if ! netns_switch "$P"; then
  echo "SKIPPED: cannot create network namespaces here ($NETNS_ERROR); needs root/CAP_NET_ADMIN"
  exit 0
fi
for n in "${NODES[@]}"; do netns_host "$P" "$n"; done
echo "hosts: $(for n in "${NODES[@]}"; do printf '%s=%s ' "$P-$n" "${IP[$n]}"; done)"

on() { local n=$1; shift; ip netns exec "$P-$n" "$@"; }  # (not for `&`: $! would be a subshell)
PS_LIST="${IP[ps0]}:$PORT,${IP[ps1]}:$PORT"

# run_job NAME WORKER_FLAGS...: fresh shards, two workers; leaves metrics in $SCRATCH/NAME.
run_job() {
  local name=$1 s r n
  shift
  mkdir -p "$SCRATCH/$name"
  local shard_pids=() worker_pids=()
  for s in 0 1; do
    ip netns exec "$P-ps$s" "$PS_SERVER" --host="${IP[ps$s]}" --port=$PORT --shard=$s --num_shards=2 \
      --num_workers=2 --lr=0.1 --momentum=0.9 --weight_decay=0 --step_timeout=60s \
      >"$SCRATCH/$name/shard$s.log" 2>&1 &
    shard_pids+=($!)
    pids+=($!)
  done
  # Each shard must answer SERVING to a probe from a worker's host, across the bridge.
  for s in 0 1; do
    for _ in $(seq 100); do
      on w0 "$HEALTH_PROBE" --addr="${IP[ps$s]}:$PORT" --timeout=1s >/dev/null 2>&1 && break
      kill -0 "${shard_pids[$s]}" 2>/dev/null || die "shard $s exited: $(cat "$SCRATCH/$name/shard$s.log")"
      sleep 0.1
    done
    on w0 "$HEALTH_PROBE" --addr="${IP[ps$s]}:$PORT" --timeout=1s \
      || die "shard $s not SERVING from w0: $(cat "$SCRATCH/$name/shard$s.log")"
  done
  for r in 0 1; do
    ip netns exec "$P-w$r" "$GPU_WORKER" --ps="$PS_LIST" --rank=$r --world_size=2 --model=mlp \
      --batch_size=128 --lr=0.1 --threads=1 --device=cpu --connect_timeout=60s \
      --data_dir="$DATA_DIR" --metrics_out="$SCRATCH/$name/worker$r.jsonl" "$@" \
      >"$SCRATCH/$name/worker$r.log" 2>&1 &
    worker_pids+=($!)
    pids+=($!)
  done
  for r in 0 1; do
    wait "${worker_pids[$r]}" || die "$name: worker $r failed: $(tail -n 5 "$SCRATCH/$name/worker$r.log")"
  done
  for s in 0 1; do kill -TERM "${shard_pids[$s]}" 2>/dev/null || true; done
  for s in 0 1; do wait "${shard_pids[$s]}" 2>/dev/null || true; done
}

# probe_ring NAME: the communication benchmark's ring all-reduce of 16 MiB as two processes
# on w0 and w1 (tests/bench/comm_probe); leaves rank 0's JSON line in $SCRATCH/NAME.json.
probe_ring() {
  local name=$1 p0 p1
  local flags=(--mode=allreduce --world_size=2 --master_addr="${IP[w0]}" --master_port=$PORT
               --size_mib=16 --reps=3)
  ip netns exec "$P-w0" "$COMM_PROBE" --rank=0 --advertise_host="${IP[w0]}" "${flags[@]}" \
    >"$SCRATCH/$name.json" 2>"$SCRATCH/$name.err" &
  p0=$!
  pids+=($p0)
  ip netns exec "$P-w1" "$COMM_PROBE" --rank=1 --advertise_host="${IP[w1]}" "${flags[@]}" \
    >/dev/null 2>>"$SCRATCH/$name.err" &
  p1=$!
  pids+=($p1)
  wait $p0 && wait $p1 || die "$name: comm_probe failed: $(cat "$SCRATCH/$name.err")"
}

rx_bytes() { ip -n "$SW" -s -j link show "v-$1" | sed -n 's/.*"rx":{"bytes":\([0-9]*\).*/\1/p'; }

# 1. One epoch across four hosts.
start=$SECONDS
run_job epoch --epochs=1
for r in 0 1; do
  m="$SCRATCH/epoch/worker$r.jsonl"
  acc=$(json_field "$m" final test_acc)
  ips=$(json_field "$m" final images_per_s)
  echo "rank $r (${IP[w$r]}): test_acc $acc, $ips images/s"
  awk -v a="$acc" 'BEGIN { exit !(a >= 0.75) }' || die "rank $r test accuracy $acc < 0.75"
done
# Bytes each worker sent into the bridge: at least what it pushed (gradients, all steps).
for r in 0 1; do
  pushed=$(json_field "$SCRATCH/epoch/worker$r.jsonl" final bytes_pushed)
  sent=$(rx_bytes "w$r")
  echo "w$r: pushed $pushed bytes of gradients, its veth carried $sent bytes into the bridge"
  ((sent >= pushed)) || die "w$r's traffic did not go through the bridge ($sent < $pushed)"
done
echo "one epoch on 4 hosts in $((SECONDS - start)) s"

# 2. Throughput without and with a link limit.
run_job fast --epochs=1 --max_steps_per_epoch=20
probe_ring ring_fast
shaping="netem delay 1ms rate 1gbit"
for n in "${NODES[@]}"; do
  for dev in "$SW v-$n" "$P-$n eth0"; do
    set -- $dev
    if ! ip netns exec "$1" tc qdisc add dev "$2" root netem delay 1ms rate 1gbit 2>/dev/null; then
      shaping="tbf rate 1gbit (sch_netem is not in this kernel: no added delay)"
      ip netns exec "$1" tc qdisc add dev "$2" root tbf rate 1gbit burst 256kb latency 50ms \
        || { echo "SKIPPED shaping: tc cannot limit $2 here"; echo PASS; exit 0; }
    fi
  done
done
run_job shaped --epochs=1 --max_steps_per_epoch=20
probe_ring ring_shaped
fast=$(json_field "$SCRATCH/fast/worker0.jsonl" final images_per_s)
slow=$(json_field "$SCRATCH/shaped/worker0.jsonl" final images_per_s)
echo "images/s per worker, 20 steps of mlp, batch 128: unlimited $fast, with $shaping on" \
  "every veth $slow"

# The ring all-reduce behaves like a real 1 Gbit/s network: it cannot beat the wire (each
# worker sends 16 MiB per all-reduce, >= 134 ms at 125 MB/s), and it gets close to it.
ring_field() { sed -n "s/.*\"$2\":\([0-9.e]*\).*/\1/p" "$SCRATCH/$1.json"; }
t_fast=$(ring_field ring_fast median_s)
t_shaped=$(ring_field ring_shaped median_s)
sent=$(ring_field ring_shaped sent_per_sync)
wire=$(echo "$sent / 125000000" | bc -l)
echo "ring all-reduce of 16 MiB between two namespaces: ${t_fast}s unlimited," \
  "${t_shaped}s with $shaping (wire time of the bytes sent: ${wire}s;" \
  "busbw $(ring_field ring_fast busbw_GBps) -> $(ring_field ring_shaped busbw_GBps) GB/s)"
awk -v t="$t_shaped" -v w="$wire" 'BEGIN { exit !(t >= 0.9 * w) }' ||
  die "the shaped ring beat the 1 Gbit/s wire: ${t_shaped}s < 0.9 x ${wire}s"
awk -v t="$t_shaped" -v w="$wire" 'BEGIN { exit !(t <= 3 * w) }' ||
  die "the shaped ring is far from the wire: ${t_shaped}s > 3 x ${wire}s"
echo PASS
