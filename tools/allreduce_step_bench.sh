#!/usr/bin/env bash
# The all-reduce worker's whole step against the bare ring, interleaved: ROUNDS rounds (default
# 3) of comm_benchmark over allreduce (ShardedRingStore, the CPU worker's default),
# allreduce_replicated (all-reduce, then the whole optimizer on every replica) and ring;
# prints the median time of each point and the ratio to the ring's.
# Usage: tools/allreduce_step_bench.sh [ROUNDS] (after bazel build //tests/bench:comm_benchmark)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
bin=bazel-bin/tests/bench/comm_benchmark
[[ -x $bin ]] || { echo "build first: bazel build //tests/bench:comm_benchmark" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for ((i = 0; i < rounds; ++i)); do
  "$bin" --modes=allreduce,allreduce_replicated,ring --workers=2,4,8 --sizes_mib=16,64 \
    --models= --reps=5 --out="$tmp/r$i" >/dev/null
  cat "$tmp/r$i/comm.csv" >>"$tmp/all.csv"
done
python3 - "$tmp/all.csv" "$rounds" <<'PY'
import statistics, sys
times = {}
header = None
for line in open(sys.argv[1]):
    f = line.strip().split(",")
    if f[0] == "mode":
        header = f
        continue
    r = dict(zip(header, f))
    key = (r["mode"], int(r["workers"]), r["what"])
    times.setdefault(key, []).append(1000 * float(r["seconds"]))
print(f"medians of {sys.argv[2]} interleaved rounds (ms); ratio = time / ring's time")
print("| N | size | ring | allreduce (sharded) | ratio | allreduce_replicated | ratio |")
print("|---|---|---|---|---|---|---|")
for (mode, n, size) in sorted((k for k in times if k[0] == "ring"),
                              key=lambda k: (k[1], int(k[2].split()[0]))):
    ring = statistics.median(times[("ring", n, size)])
    sh = statistics.median(times[("allreduce", n, size)])
    rep = statistics.median(times[("allreduce_replicated", n, size)])
    print(f"| {n} | {size} | {ring:.1f} | {sh:.1f} | {sh/ring:.2f} | {rep:.1f} | {rep/ring:.2f} |")
PY
