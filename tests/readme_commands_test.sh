#!/usr/bin/env bash
# The README's "Running the pieces by hand" blocks work when pasted into a shell (issue 31:
# a ps_server line without `&` blocked the terminal, a `sleep 1` was shorter than rank 0's
# start). Each ```sh block of that section runs in bash from a folder whose bazel-bin holds
# the built binaries, with the epochs cut short and the data from the test's data folder.
source "$(dirname "$0")/testlib.sh"
need_data
work="$SCRATCH/readme"
mkdir -p "$work/bazel-bin/server" "$work/bazel-bin/worker" "$work/deploy"
ln -sf "$PS_SERVER" "$work/bazel-bin/server/ps_server"
ln -sf "$GPU_WORKER" "$work/bazel-bin/worker/gpu_worker"
# The blocks of the section, one file each.
python3 - "$ROOT/README.md" "$work" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
section = text.split("## Running the pieces by hand", 1)[1].split("\n## ", 1)[0]
blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
for i, block in enumerate(blocks):
    open(f"{sys.argv[2]}/block{i}.sh", "w").write(block)
print(len(blocks), "blocks")
PY
ran=0
for block in "$work"/block*.sh; do
  # Short runs: one epoch of a few steps; the launcher lines are the launcher's own test's.
  sed -i -e 's/--epochs=[0-9]*/--epochs=1 --max_steps_per_epoch=20 --test_subset=500 --threads=1/g' \
    -e "s|/tmp/|$work/|g" -e '/^bazel build/d' -e '/local_cluster.sh/,/[^\\]$/d' "$block"
  grep -q . "$block" || continue
  echo "--- $(basename "$block"):"
  cat "$block"
  (cd "$work" && DPTRAIN_DATA_DIR="$DATA_DIR" timeout 120 bash -e "$block") >"$block.log" 2>&1 ||
    die "$(basename "$block") failed: $(tail -5 "$block.log")"
  grep -qE "done: [0-9]+ epochs" "$block.log" || die "$(basename "$block"): no worker finished: $(tail -5 "$block.log")"
  ran=$((ran + 1))
done
((ran >= 2)) || die "only $ran README blocks ran"
echo "ok: $ran README blocks ran as pasted"
