#!/usr/bin/env bash
# End to end with the real binaries through the launcher: 2 shards, 2 workers, mlp, one epoch
# of Fashion-MNIST on loopback with free ports. Test accuracy must reach 0.75.
source "$(dirname "$0")/testlib.sh"
need_data

"$LAUNCHER" --bin="$ROOT" --shards=2 --workers=2 --lr=0.1 --momentum=0.9 \
  --logs="$SCRATCH/cluster" -- --model=mlp --epochs=1 --batch_size=128 --threads=1 \
  --data_dir="$DATA_DIR" | tee "$SCRATCH/out.txt"

for r in 0 1; do
  metrics="$SCRATCH/cluster/worker$r.jsonl"
  [[ -s "$metrics" ]] || die "no metrics from worker $r"
  acc=$(json_field "$metrics" final test_acc)
  echo "worker $r: test_acc $acc"
  awk -v a="$acc" 'BEGIN { exit !(a >= 0.75) }' || die "worker $r test accuracy $acc < 0.75"
  grep -q "\"event\":\"epoch\".*\"images_per_s\":[0-9]" "$metrics" || die "no epoch line"
  pushed=$(json_field "$metrics" final bytes_pushed)
  ((pushed > 0)) || die "worker $r pushed no bytes"
done
# ps mode without --lr: the metrics carry the shards' constant rate, not 0 (issue 31 item 7).
start_shard 0 1 1 --lr=0.05
"$GPU_WORKER" --ps=127.0.0.1:$SHARD_PORT --model=mlp --epochs=1 --max_steps_per_epoch=3 \
  --test_subset=100 --threads=1 --data_dir="$DATA_DIR" --metrics_out="$SCRATCH/nolr.jsonl" \
  >"$SCRATCH/nolr.txt" 2>&1 || die "ps mode without --lr: $(cat "$SCRATCH/nolr.txt")"
rate=$(json_field "$SCRATCH/nolr.jsonl" epoch learning_rate)
awk -v r="$rate" 'BEGIN { exit !(r > 0.0499999 && r < 0.0500001) }' ||
  die "ps mode without --lr: learning_rate '$rate' in the metrics, not 0.05"
echo "ok: ps mode without --lr reports the shards' rate $rate"
grep -q "rank 0 epoch 1/1" "$SCRATCH/out.txt" || die "no progress line from rank 0"
grep -q "rank 1 epoch 1/1" "$SCRATCH/out.txt" || die "no progress line from rank 1"

# A failing worker stops the whole cluster with a report naming it, and leaves nothing behind.
set +e
"$LAUNCHER" --bin="$ROOT" --shards=2 --workers=2 --logs="$SCRATCH/bad" -- --model=nope \
  --data_dir="$DATA_DIR" >"$SCRATCH/bad.txt" 2>&1
rc=$?
set -e
((rc != 0)) || die "launcher succeeded with a bad model"
grep -q "FAILED: worker . exited with status 1" "$SCRATCH/bad.txt" || die "$(cat "$SCRATCH/bad.txt")"
grep -q "unknown model 'nope'" "$SCRATCH/bad.txt" || die "the worker's error was not reported"
sleep 0.5
if pgrep -f -- "--port_file=$SCRATCH/bad/" >/dev/null; then die "orphaned shard processes"; fi

# Stopping the launcher (SIGTERM here; Ctrl-C in a terminal is the same trap) stops every process.
"$LAUNCHER" --bin="$ROOT" --shards=2 --workers=2 --logs="$SCRATCH/stop" -- --model=mlp \
  --epochs=100 --threads=1 --data_dir="$DATA_DIR" >"$SCRATCH/stop.txt" 2>&1 &
launcher=$!
for _ in $(seq 300); do
  grep -q "epoch 1/100" "$SCRATCH/stop.txt" 2>/dev/null && break
  sleep 0.1
done
grep -q "epoch 1/100" "$SCRATCH/stop.txt" || die "training did not start: $(cat "$SCRATCH/stop.txt")"
kill -TERM $launcher
set +e
wait $launcher
rc=$?
set -e
((rc != 0)) || die "a stopped launcher reported success"
sleep 0.5
if pgrep -f -- "$SCRATCH/stop/" >/dev/null; then die "processes left after stopping the launcher"; fi

# Shard flags through the launcher (issue 31 item 3): the worker's --optimizer=adam makes it
# check that the shards apply adam; "{i}" gives each shard its own metrics port file.
"$LAUNCHER" --bin="$ROOT" --shards=2 --workers=2 --optimizer=adam --lr=0.002 \
  --metrics_port=0 --metrics_port_file="$SCRATCH/mport{i}" --logs="$SCRATCH/pass" -- \
  --model=mlp --epochs=1 --max_steps_per_epoch=20 --threads=1 --optimizer=adam \
  >"$SCRATCH/pass.txt" 2>&1 || die "launcher with shard flags: $(tail -5 "$SCRATCH/pass.txt")"
[[ -s "$SCRATCH/mport0" && -s "$SCRATCH/mport1" ]] || die "no per-shard metrics port files"
set +e
"$LAUNCHER" --bin="$ROOT" --optimizer=adam --bogus=1 -- --model=mlp >"$SCRATCH/bogus.txt" 2>&1
rc=$?
set -e
((rc == 2)) && grep -q "^local_cluster: --bogus=1 is not a flag of ps_server" "$SCRATCH/bogus.txt" ||
  die "an unknown launcher flag: rc=$rc $(cat "$SCRATCH/bogus.txt")"
echo PASS
