#!/bin/bash
# Which torchvision classification models gpu_worker imports and trains exactly as PyTorch:
# exports each (10 classes, 3x64x64, for training: tools/make_onnx_fixtures.py --torchvision)
# with PyTorch's float64 loss, gradients and batch-norm statistics of one train step from the
# same weights, then checks our step against it (worker/graph/onnx_import_test: the whole step
# in double exactly, the float model's loss; one test line per model).
#
# Needs Debian's python3-torch and python3-torchvision (not part of the suite: about 3.5 GB of
# fixtures for the default list, written to a temporary folder). AlexNet and VGG-11-BN run at
# 224x224 (their adaptive pooling exports only from a multiple of its output size; 2.2 GB of
# those fixtures), ViT-B/16 and MaxViT-T too (their image size is fixed), Inception v3 at 96x96 (its
# stem needs 75x75), the others (Swin-T too) at 64x64.
# Usage: tools/check_torchvision_onnx.sh [--dynamic_batch] [MODEL,MODEL,...]
set -euo pipefail
cd "$(dirname "$0")/.."
dynamic=()
if [[ "${1:-}" == "--dynamic_batch" ]]; then
  dynamic=(--dynamic_batch)
  shift
fi
models="${1:-resnet18,resnet50,resnext50_32x4d,wide_resnet50_2,squeezenet1_1,densenet121,googlenet,mobilenet_v2,mobilenet_v3_small,mobilenet_v3_large,shufflenet_v2_x0_5,shufflenet_v2_x1_0,mnasnet0_5,mnasnet1_0,efficientnet_b0,efficientnet_v2_s,regnet_x_400mf,regnet_y_400mf,convnext_tiny,inception_v3,alexnet,vgg11_bn,vit_b_16,swin_t,maxvit_t}"
if ! /usr/bin/python3 -c "import torchvision" 2>/dev/null; then
  echo "check_torchvision_onnx: needs python3-torchvision (apt-get install python3-torchvision)" >&2
  exit 1
fi
dir="$(mktemp -d /tmp/torchvision_onnx.XXXXXX)"
trap 'rm -rf "$dir"' EXIT
failed=()
IFS=',' read -r -a names <<<"$models"
for name in "${names[@]}"; do
  if ! /usr/bin/python3 tools/make_onnx_fixtures.py --out_dir="$dir" "${dynamic[@]}" \
      --torchvision="$name" >"$dir/$name.log" 2>&1; then
    echo "model $name: export failed: $(grep -E 'Error|error' "$dir/$name.log" | tail -1)"
    failed+=("$name")
  fi
done
# One test process for every model: the whole list (ViT-B/16, the 224x224 ones) takes longer
# than a test's default timeout on a small machine.
bazel test //worker/graph:onnx_import_test --test_env=DPTRAIN_ONNX_FIXTURES="$dir" \
  --test_filter='FromEnvironment/*' --nocache_test_results --test_output=all \
  --test_timeout=7200 >"$dir/test.log" 2>&1 || true
grep -E '^\[ +(OK|FAILED) +\] FromEnvironment' "$dir/test.log" | sed -E 's/ \([0-9]+ ms\)$//' | sort -u
# A model without a result line (the test timed out or crashed before it) is a failure too.
for name in "${names[@]}"; do
  if [[ " ${failed[*]} " != *" $name "* ]] &&
      ! grep -qE "^\[ +OK +\] FromEnvironment.*/tv_${name}\$|^\[ +OK +\] FromEnvironment.*/tv_${name} " "$dir/test.log"; then
    echo "model $name: no result (the test timed out or crashed first: $(grep -E 'TIMEOUT|Segmentation|Killed' "$dir/test.log" | head -1))"
    failed+=("$name")
  fi
done
if grep -q '^\[  FAILED  \] FromEnvironment' "$dir/test.log" || ((${#failed[@]} > 0)); then
  grep -B2 -A6 'Failure' "$dir/test.log" | head -60
  exit 1
fi
