#!/usr/bin/env bash
# Telemetry end to end with the real binaries: 2 shards and 2 workers (mlp) serve /metrics
# on free ports; every scrape passes `promtool check metrics`; a real Prometheus server
# (Debian's, on loopback, a config written here) scrapes the job and a counter is read back
# through its query API; /status and ps_status show the job; both sides write a Chrome
# trace of the first steps; workers print progress lines with an ETA.
source "$(dirname "$0")/testlib.sh"
need_data
PS_STATUS="$ROOT/server/ps_status"
command -v promtool >/dev/null || die "promtool not found (tools/setup.sh installs Debian's prometheus)"
command -v prometheus >/dev/null || die "prometheus not found (tools/setup.sh installs it)"
command -v curl >/dev/null || die "curl not found"

wait_file() {  # wait_file PATH WHAT
  for _ in $(seq 200); do [[ -s "$1" ]] && return 0; sleep 0.05; done
  die "$2: $1 never appeared"
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

for s in 0 1; do
  start_shard "$s" 2 2 --lr=0.05 --momentum=0.9 --metrics_port=0 \
    --metrics_port_file="$SCRATCH/shard$s.mport" --trace_out="$SCRATCH/shard$s.trace.json" \
    --trace_steps=5
  ports[$s]=$SHARD_PORT
  wait_file "$SCRATCH/shard$s.mport" "shard $s metrics port"
  mports[$s]=$(cat "$SCRATCH/shard$s.mport")
done
PS="127.0.0.1:${ports[0]},127.0.0.1:${ports[1]}"

# A taken metrics port is refused before any work, naming the port.
set +e
"$PS_SERVER" --port=0 --metrics_port="${mports[0]}" >"$SCRATCH/taken.txt" 2>&1
rc=$?
set -e
((rc != 0)) || die "a taken --metrics_port was accepted"
grep -q "metrics_port.*${mports[0]}" "$SCRATCH/taken.txt" || die "unclear error: $(cat "$SCRATCH/taken.txt")"
# An unwritable trace path too.
set +e
"$GPU_WORKER" --ps="$PS" --trace_out=/nonexistent/t.json >"$SCRATCH/badtrace.txt" 2>&1
rc=$?
set -e
((rc != 0)) && grep -q "trace_out.*/nonexistent/t.json" "$SCRATCH/badtrace.txt" ||
  die "bad --trace_out: rc=$rc $(cat "$SCRATCH/badtrace.txt")"

# A real Prometheus scraping all four, started (and ready) before the workers, whose metrics
# ports are chosen now: on a fast machine the workers' 6 epochs take a few seconds, which
# Prometheus's own start could otherwise use up before its first scrape.
wports=("$(free_port)" "$(free_port)")
PROM_PORT=$(free_port)
cat >"$SCRATCH/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: dptrain
    static_configs:
      - targets: ["127.0.0.1:${mports[0]}", "127.0.0.1:${mports[1]}", "127.0.0.1:${wports[0]}", "127.0.0.1:${wports[1]}"]
YAML
promtool check config "$SCRATCH/prometheus.yml" >/dev/null || die "promtool rejects the config"
prometheus --config.file="$SCRATCH/prometheus.yml" --storage.tsdb.path="$SCRATCH/tsdb" \
  --web.listen-address="127.0.0.1:$PROM_PORT" >"$SCRATCH/prometheus.log" 2>&1 &
_started+=($!)
for _ in $(seq 300); do curl -sf "http://127.0.0.1:$PROM_PORT/-/ready" >/dev/null && break; sleep 0.1; done
curl -sf "http://127.0.0.1:$PROM_PORT/-/ready" >/dev/null ||
  die "Prometheus not ready after 30 s: $(tail -3 "$SCRATCH/prometheus.log")"

for r in 0 1; do
  "$GPU_WORKER" --ps="$PS" --rank=$r --world_size=2 --model=mlp --epochs=6 --batch_size=64 \
    --threads=1 --data_dir="$DATA_DIR" --stream_min_bytes=$((r == 0 ? 0 : 1 << 30)) \
    --metrics_port="${wports[$r]}" --metrics_port_file="$SCRATCH/worker$r.mport" \
    --trace_out="$SCRATCH/worker$r.trace.json" --trace_steps=5 --log_every=0.5s \
    --metrics_out="$SCRATCH/worker$r.jsonl" >"$SCRATCH/worker$r.log" 2>&1 &
  wpids[$r]=$!
  _started+=($!)
done
for r in 0 1; do wait_file "$SCRATCH/worker$r.mport" "worker $r metrics port"; done

# Scrape the workers while they train; every scrape must pass promtool.
scrapes=0
while kill -0 "${wpids[0]}" 2>/dev/null; do
  for r in 0 1; do
    if curl -sf "http://127.0.0.1:${wports[$r]}/metrics" >"$SCRATCH/w$r.prom.tmp"; then
      mv "$SCRATCH/w$r.prom.tmp" "$SCRATCH/w$r.prom"
      scrapes=$((scrapes + 1))
    fi
  done
  sleep 0.3
done
for r in 0 1; do wait "${wpids[$r]}" || die "worker $r failed: $(tail -5 "$SCRATCH/worker$r.log")"; done
((scrapes >= 4)) || die "only $scrapes worker scrapes succeeded"
for r in 0 1; do
  promtool check metrics <"$SCRATCH/w$r.prom" || die "promtool rejects worker $r's metrics"
  steps=$(sed -n 's/^dptrain_worker_steps_total \([0-9.e+]*\)$/\1/p' "$SCRATCH/w$r.prom")
  awk -v s="$steps" 'BEGIN { exit !(s > 0) }' || die "worker $r: no steps in its metrics"
  grep -q '^dptrain_worker_step_phase_seconds_bucket{phase="compute",le="+Inf"} [1-9]' "$SCRATCH/w$r.prom" ||
    die "worker $r: no compute phase histogram"
  grep -q '^dptrain_worker_pushed_bytes_total [1-9]' "$SCRATCH/w$r.prom" || die "worker $r: no bytes pushed"
  grep -q '^dptrain_worker_loss_scale 1$' "$SCRATCH/w$r.prom" || die "worker $r: no loss scale 1 (fp32)"
  ! grep -q '^dptrain_worker_gpu_memory_bytes' "$SCRATCH/w$r.prom" || die "worker $r: GPU memory on the CPU"
done
for s in 0 1; do
  curl -sf "http://127.0.0.1:${mports[$s]}/metrics" >"$SCRATCH/s$s.prom" || die "shard $s: no /metrics"
  promtool check metrics <"$SCRATCH/s$s.prom" || die "promtool rejects shard $s's metrics"
  for method in stream push_pull; do
    grep -q "^dptrain_ps_requests_total{method=\"$method\",code=\"OK\"} [1-9]" "$SCRATCH/s$s.prom" ||
      die "shard $s: no successful $method calls counted: $(grep requests_total "$SCRATCH/s$s.prom")"
  done
  grep -q '^dptrain_ps_step_seconds_count [1-9]' "$SCRATCH/s$s.prom" || die "shard $s: no step latencies"
  grep -q '^dptrain_ps_version [1-9]' "$SCRATCH/s$s.prom" || die "shard $s: version 0"
done

# The status view: JSON at /status and one line per shard from ps_status.
curl -sf "http://127.0.0.1:${mports[0]}/status" >"$SCRATCH/status.json" || die "no /status"
python3 - "$SCRATCH/status.json" <<'PY' || die "bad /status: $(cat "$SCRATCH/status.json")"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["shard"] == 0 and s["num_workers"] == 2 and s["version"] > 0, s
assert [r["step"] for r in s["ranks"]] == [s["version"] - 1] * 2, s["ranks"]
assert s["slowest_rank"] in (0, 1) and s["optimizer"]["momentum"] > 0.89, s
PY
"$PS_STATUS" --ps="$PS" | tee "$SCRATCH/ps_status.txt"
[[ $(grep -c "shard ./2  job dptrain  bsp  version [1-9]" "$SCRATCH/ps_status.txt") == 2 ]] ||
  die "ps_status did not show both shards"
set +e
"$PS_STATUS" --ps="127.0.0.1:1" --timeout=1s >"$SCRATCH/ps_status_bad.txt" 2>&1
rc=$?
set -e
((rc == 1)) || die "ps_status on a dead address exited $rc"

# Prometheus read back a counter of each kind through its query API.
query() {
  curl -sf "http://127.0.0.1:$PROM_PORT/api/v1/query" --data-urlencode "query=$1" |
    python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(max([float(x["value"][1]) for x in r] or [0]))'
}
for _ in $(seq 40); do
  ps_pushes=$(query 'sum(dptrain_ps_pushes_total)' || echo 0)
  awk -v v="$ps_pushes" 'BEGIN { exit !(v > 0) }' && break
  sleep 0.5
done
awk -v v="$ps_pushes" 'BEGIN { exit !(v > 0) }' || die "Prometheus has no dptrain_ps_pushes_total: $(tail -3 "$SCRATCH/prometheus.log")"
worker_steps=$(query 'max_over_time(dptrain_worker_steps_total[5m])')
awk -v v="$worker_steps" 'BEGIN { exit !(v > 0) }' || die "Prometheus never scraped a worker's steps"
echo "Prometheus: shard pushes $ps_pushes, worker steps $worker_steps"

# Traces: valid Chrome JSON with the phases of the first 5 steps.
for f in worker0 worker1 shard0 shard1; do
  python3 - "$SCRATCH/$f.trace.json" "$f" <<'PY' || die "bad trace $f"
import json, sys
doc = json.load(open(sys.argv[1]))
spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
names = {e["name"] for e in spans}
steps = {e["args"]["step"] for e in spans}
# Rank 0 streams its steps (push, then wait and pull per shard); rank 1 sends unary calls.
want = {"data", "forward", "backward", "sync", "push", "wait", "pull"} if sys.argv[2] == "worker0" \
    else {"data", "forward", "backward", "sync", "push_pull (unary)"} if sys.argv[2] == "worker1" \
    else {"sum", "apply", "wait for ranks", "send"}
assert want <= names, (want - names, names)
assert steps == set(range(5)), steps
assert all(e["dur"] >= 0 for e in spans)
print(sys.argv[2], len(spans), "spans")
PY
done

# Progress lines within an epoch, and one per epoch as before.
grep -q "rank 0 epoch [1-6]/6 step [0-9]*/469 .*images/s .*compute [0-9]*% sync [0-9]*% .*ETA" "$SCRATCH/worker0.log" ||
  die "no progress line: $(head -20 "$SCRATCH/worker0.log")"
grep -q "rank 0 epoch 6/6  loss" "$SCRATCH/worker0.log" || die "no epoch line"
# Curves from the metrics files (Debian's matplotlib, so the system python).
PLOT="$ROOT/tools/plot_curves.py"
/usr/bin/python3 "$PLOT" --out="$SCRATCH/curves.png" "$SCRATCH"/worker*.jsonl || die "plot_curves failed"
[[ $(head -c 8 "$SCRATCH/curves.png" | od -An -tx1 | tr -d ' ') == 89504e470d0a1a0a ]] || die "curves.png is not a PNG"
echo '{"event":"final"}' >"$SCRATCH/noepoch.jsonl"
set +e
/usr/bin/python3 "$PLOT" --out="$SCRATCH/x.png" "$SCRATCH/noepoch.jsonl" 2>"$SCRATCH/plot_err.txt"
rc=$?
set -e
((rc == 1)) && grep -q "noepoch.jsonl: no epoch line" "$SCRATCH/plot_err.txt" || die "plot_curves on a file without epochs: rc=$rc"
echo PASS
