#!/usr/bin/env bash
# There (the lent GPU machine, from the repo root, with .carry from tools/gpu/bundle.sh):
# unpacks the bundle and, in one call, runs every GPU check and prints a short table last:
#   1. the GPU unit tests: the probe, every kernel against its CPU reference, the allocator,
#      and CPU-vs-GPU parity of every layer and every model (strict fp32 <= 1e-5, TF32
#      <= 5e-3); a skip here is a failure;
#   2. gpu_worker's device choice (--device=auto must pick the GPU);
#   3. ResNet-18 training on Fashion-MNIST on the GPU: one worker, then 2 PS shards with 2
#      workers sharing the GPU (EPOCHS, default 10; the target is test accuracy >= 0.92);
#   4. the step time of our CUDA backend (gpu_benchmark) and of PyTorch eager on the same
#      GPU (torch_resnet.py: fp32, TF32, bf16 autocast, and the FLOPs floor).
# The table goes to $OUT/summary.md and every log into $OUT/gpu-logs.tar.gz (the device
# tool brings back at most 8 files). SKIP_TRAINING=1 skips step 3.
# usage: tools/gpu/check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
results="${OUT:-/tmp/gpu-out}"
mkdir -p "$results"
root=$(mktemp -d)
tar -C "$root" -xJf .carry/gpu.tar.xz || { echo "gpu/check: no bundle (.carry/gpu.tar.xz)"; exit 1; }
bin="$root/gpu/bin"
out="$root/logs"
mkdir -p "$out" "$root/cluster-bin/server" "$root/cluster-bin/worker"
ln -s "$bin/ps_server" "$root/cluster-bin/server/ps_server"  # deploy/local_cluster.sh's layout
ln -s "$bin/gpu_worker" "$root/cluster-bin/worker/gpu_worker"

# cuBLAS and cuDNN are not in the bundle: take CUDA 13's from this machine (the toolkit's,
# or the ones PyTorch's wheels installed).
libdirs=()
for lib in libcublas.so.13 libcublasLt.so.13 libcudnn.so.9; do
  found=$( { ls /usr/local/cuda/lib64/$lib 2>/dev/null
             python3 -c 'import glob, os, site, sys
for base in site.getsitepackages():
    for p in glob.glob(os.path.join(base, "nvidia", "**", sys.argv[1]), recursive=True):
        print(p)' "$lib" 2>/dev/null; } | head -1)
  if [[ -z "$found" ]]; then
    echo "gpu/check: $lib is not on this machine (looked in /usr/local/cuda/lib64 and" \
         "python3's nvidia packages)"
    exit 1
  fi
  libdirs+=("$(dirname "$found")")
done
extra=$(printf '%s\n' "${libdirs[@]}" | sort -u | paste -sd:)
export LD_LIBRARY_PATH="$root/gpu/lib:$extra${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{ nvidia-smi -L; echo "cuBLAS/cuDNN from: $extra"; } 2>&1 | tee "$out/nvidia-smi.txt"
rows=()
fail=0

for t in device_probe_test kernels_test cuda_raw_allocator_test gpu_network_test \
         gpu_parity_test; do
  "$bin/$t" >"$out/$t.log" 2>&1
  if grep -q "SKIPPED" "$out/$t.log" || ! grep -q "PASSED" "$out/$t.log"; then
    rows+=("| $t | FAIL (see $t.log): $(grep -m1 -E 'Failure|error|SKIPPED' "$out/$t.log" | head -c 150) |")
    fail=1
  else
    rows+=("| $t | pass ($(grep -c '^\[       OK' "$out/$t.log") tests) |")
  fi
done

"$bin/gpu_worker" --device=auto --mode=allreduce --world_size=1 --rank=0 \
  --lr=0.1 --data_dir=/nonexistent >"$out/gpu_worker_auto.log" 2>&1
if grep -q "device cuda (GPU 0 is a" "$out/gpu_worker_auto.log"; then
  rows+=("| --device=auto | $(grep -o "device cuda ([^)]*)" "$out/gpu_worker_auto.log" | head -1) |")
else
  rows+=("| --device=auto | FAIL: $(head -c 200 "$out/gpu_worker_auto.log" | tr '\n' ' ') |")
  fail=1
fi

# The final test accuracy of rank 0 in a worker log, or "none".
final_accuracy() {
  grep -o "rank 0 done: .*test_acc [0-9.]*" "$1" 2>/dev/null | grep -o "test_acc [0-9.]*" |
    cut -d' ' -f2 || true
}
epochs="${EPOCHS:-10}"
if [[ "${SKIP_TRAINING:-0}" != 1 ]]; then
  data="$root/gpu/data"
  "$bin/gpu_worker" --device=cuda --mode=allreduce --world_size=1 --rank=0 --model=resnet18 \
    --lr=0.1 --epochs="$epochs" --batch_size=256 --data_dir="$data" \
    --metrics_out="$out/train_1gpu.jsonl" >"$out/train_1gpu.log" 2>&1
  acc=$(final_accuracy "$out/train_1gpu.log")
  rows+=("| ResNet-18, 1 worker, $epochs epochs | test_acc ${acc:-none} (target >= 0.92; train_1gpu.log) |")
  awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 0.92) }' || fail=1
  deploy/local_cluster.sh --bin="$root/cluster-bin" --shards=2 --workers=2 --lr=0.1 --logs="$out/cluster" \
    -- --device=cuda --model=resnet18 --epochs="$epochs" --batch_size=256 \
    --data_dir="$data" >"$out/train_2x2.log" 2>&1
  acc=$(final_accuracy "$out/cluster/worker0.log")
  rows+=("| ResNet-18, 2 shards x 2 workers on one GPU, $epochs epochs | test_acc ${acc:-none} (target >= 0.92; cluster/) |")
  awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 0.92) }' || fail=1
fi

"$bin/gpu_benchmark" --models=resnet18,lenet,mlp --math=fp32,tf32,bf16,fp16 >"$out/gpu_benchmark.md" \
  2>"$out/gpu_benchmark.err" || { rows+=("| gpu_benchmark | FAIL (see gpu_benchmark.err) |"); fail=1; }
PYTHONUNBUFFERED=1 python3 "$root/gpu/torch_resnet.py" --out="$out/torch_resnet.md" \
  >"$out/torch_resnet.log" 2>&1 || { rows+=("| PyTorch ResNet-18 | FAIL (see torch_resnet.log) |"); fail=1; }

{
  echo
  echo "$(head -1 "$out/nvidia-smi.txt"), $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "| check | result |"
  echo "|---|---|"
  printf '%s\n' "${rows[@]}"
  [[ -f "$out/gpu_benchmark.md" ]] && { echo; sed -n '/^Ours/,$p' "$out/gpu_benchmark.md"; }
  [[ -f "$out/torch_resnet.md" ]] && { echo; cat "$out/torch_resnet.md"; }
} | tee "$results/summary.md"
tar -C "$root" -czf "$results/gpu-logs.tar.gz" logs
exit $fail
