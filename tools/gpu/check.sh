#!/usr/bin/env bash
# There (the lent GPU machine, from the repo root, with .carry from tools/gpu/bundle.sh):
# unpacks the bundle and, in one call, runs what can be checked today and prints a short
# table last:
#   1. the GPU unit tests (the probe, and every kernel against its CPU reference: a skip
#      here is a failure);
#   2. gpu_worker's device choice (--device=auto must find the GPU);
#   3. PyTorch's d2l ResNet-18 step on this GPU (fp32, TF32, bf16 autocast), with the
#      step's FLOPs over the measured matrix rate: the floor our CUDA backend is held to.
# Logs go to $OUT (the device tool brings them back).
# usage: tools/gpu/check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/gpu-out}"
mkdir -p "$out"
root=$(mktemp -d)
tar -C "$root" -xJf .carry/gpu.tar.xz || { echo "gpu/check: no bundle (.carry/gpu.tar.xz)"; exit 1; }
export LD_LIBRARY_PATH="$root/gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bin="$root/gpu/bin"
nvidia-smi -L 2>&1 | tee "$out/nvidia-smi.txt"
rows=()
fail=0

for t in device_probe_test kernels_test cuda_raw_allocator_test; do
  "$bin/$t" >"$out/$t.log" 2>&1
  if grep -q "SKIPPED" "$out/$t.log" || ! grep -q "PASSED" "$out/$t.log"; then
    rows+=("| $t | FAIL (see $t.log) |")
    fail=1
  else
    rows+=("| $t | pass ($(grep -c '^\[       OK' "$out/$t.log") tests) |")
  fi
done

"$bin/gpu_worker" --device=auto --mode=allreduce --world_size=1 --rank=0 \
  --lr=0.1 --data_dir=/nonexistent >"$out/gpu_worker_auto.log" 2>&1
if grep -q "auto: GPU 0 is a" "$out/gpu_worker_auto.log"; then
  rows+=("| --device=auto | $(grep -o 'auto: [^;]*' "$out/gpu_worker_auto.log" | head -1) |")
else
  rows+=("| --device=auto | FAIL: $(head -c 200 "$out/gpu_worker_auto.log" | tr '\n' ' ') |")
  fail=1
fi

PYTHONUNBUFFERED=1 python3 "$root/gpu/torch_resnet.py" --out="$out/torch_resnet.md" \
  >"$out/torch_resnet.log" 2>&1 || { rows+=("| PyTorch ResNet-18 | FAIL (see torch_resnet.log) |"); fail=1; }

echo
echo "| check | result |"
echo "|---|---|"
printf '%s\n' "${rows[@]}"
[[ -f "$out/torch_resnet.md" ]] && { echo; cat "$out/torch_resnet.md"; }
exit $fail
