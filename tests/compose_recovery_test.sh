#!/usr/bin/env bash
# deploy/docker-compose.yml on a real Docker engine (issue 15): a shard container that dies
# mid-training (its processes SIGKILLed from the host, as in a crash or an OOM kill; unlike
# `docker kill`, the restart policy applies) is restarted by `restart: on-failure` and
# restores its newest valid checkpoint from its volume (the newest is truncated first, so it
# falls back to the one before); the workers ride it out
# (--reconnect_timeout) and the job ends with final weights bit-identical to the same job
# run without the crash (compare tests/shard_recovery_test.sh, the process-level version).
# Skips (SKIPPED in the log) only where no engine can run: not root and no daemon.
source "$(dirname "$0")/compose_lib.sh"
need_data
compose_setup
export DPTRAIN_EPOCHS=3

# run_job NAME [KILL]: the job to the end; final weights to $SCRATCH/NAME.safetensors.
run_job() {
  local name=$1 kill_shard=${2:-}
  compose up -d --quiet-pull >/dev/null 2>&1 || die "$name: compose up failed"
  if [[ -n "$kill_shard" ]]; then
    # Its checkpoint of step 200 is truncated (a crash mid-write, a bad disk) and the shard
    # killed at once: the restart falls back to step 100 (the newest 3 are kept), so the
    # workers, at step 200 or later, always go back, however fast the machine (a fixed wait
    # before the kill could let them run into the next checkpoint first).
    local want=shard-1-step-000000000200.safetensors
    # The shard's PID first: docker-compose's own start-up takes a second or more on a loaded
    # machine, and looking the PID up after the checkpoint let a CI run kill the shard only
    # after its next checkpoint (step 200, where the workers already were: nothing to go back to).
    local pid
    pid=$("$DOCKER" inspect -f '{{.State.Pid}}' "$(cid ps-1)")
    # The volume's folder on this host when the engine runs here (fast to poll), else exec.
    local vol
    vol=$("$DOCKER" volume inspect -f '{{.Mountpoint}}' "${PROJECT}_ckpt-1")
    checkpoints() { if [[ -d "$vol" ]]; then ls "$vol"; else "$DOCKER" exec "$(cid ps-1)" ls /checkpoints; fi; }
    for _ in $(seq 1200); do
      checkpoints 2>/dev/null | grep -c "$want" >/dev/null && break
      sleep 0.05
    done
    checkpoints | grep -c "$want" >/dev/null || die "no checkpoint $want"
    if [[ -d "$vol" ]]; then
      truncate -s 100 "$vol/$want"
    else
      "$DOCKER" exec "$(cid ps-1)" truncate -s 100 "/checkpoints/$want"
    fi
    kill -KILL "$pid"
    echo "killed ps-1's processes once its checkpoint of step 200 was written (and truncated)"
  fi
  wait_exit 600 worker-0 worker-1
  for r in 0 1; do
    [[ "$(exit_code worker-$r)" == 0 ]] ||
      die "$name: worker-$r exited $(exit_code worker-$r): $(compose logs --no-color --tail=5 worker-$r)"
  done
  volume_cat metrics final.safetensors >"$SCRATCH/$name.safetensors" || die "$name: no final weights"
  echo "$name: both workers exit 0, test_acc $(compose logs --no-color worker-0 |
    sed -n 's/.*done:.*test_acc \([0-9.]*\).*/\1/p' | tail -n 1)"
}

run_job reference
compose down -v -t 2 >/dev/null 2>&1
run_job crashed kill
restarts=$("$DOCKER" inspect -f '{{.RestartCount}}' "$(cid ps-1)")
echo "ps-1 restarts: $restarts; $(compose logs --no-color ps-1 | grep 'restored step' | sed -n 1p || true)"
((restarts == 1)) || die "ps-1 restarted $restarts times, expected 1"
compose logs --no-color ps-1 | grep -c "restored step" >/dev/null || die "ps-1 did not restore a checkpoint"
compose logs --no-color worker-0 worker-1 | grep "recovered by going back to step" ||
  die "no worker went back to the restored step: $(compose logs --no-color --tail=5 worker-0)"
cmp "$SCRATCH/reference.safetensors" "$SCRATCH/crashed.safetensors" ||
  die "the weights after a shard container crash differ from the uninterrupted run"
echo "final weights bit-identical ($(stat -c %s "$SCRATCH/crashed.safetensors") bytes)"
echo PASS
