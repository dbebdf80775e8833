#!/usr/bin/env bash
# Here: builds what the lent GPU machine should run (the GPU tests, the binaries) and packs it, with every shared library
# it needs that is not glibc or the CUDA driver, into .carry/gpu.tar.xz (ignored by git; the
# GPU machine lacks Debian's gRPC/protobuf/Abseil/OpenBLAS). Then, with the device tool:
#   run(command="tools/gpu/check.sh", carry=[".carry"])
# usage: tools/gpu/bundle.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ -x /usr/local/cuda/bin/nvcc || -n "${CUDA_PATH:-}" ]] ||
  { echo "gpu/bundle: no CUDA toolkit here: the bundle would hold no GPU code" >&2; exit 1; }
targets=(//worker:gpu_worker //server:ps_server //worker/cuda:device_probe_test
         //worker/cuda:kernels_test //worker/cuda:cuda_raw_allocator_test
         //tests/bench:compute_benchmark)
bazel build "${targets[@]}"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/gpu/bin" "$stage/gpu/lib"
for t in "${targets[@]}"; do
  path="bazel-bin/${t#//}"
  path="${path/://}"
  cp -L "$path" "$stage/gpu/bin/"
done
# Libraries: everything ldd resolves except glibc's own and the driver (the GPU machine's
# newer glibc and its driver must be used).
for bin in "$stage"/gpu/bin/*; do
  ldd "$bin" | awk '$3 ~ /^\// { print $3 }'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|libcuda.so*) ;;
    *) cp -L "$lib" "$stage/gpu/lib/" ;;
  esac
done
cp tools/gpu/torch_resnet.py "$stage/gpu/"
mkdir -p .carry
tar -C "$stage" -cf - gpu | xz -T2 -6 >.carry/gpu.tar.xz
echo "gpu/bundle: .carry/gpu.tar.xz, $(du -h .carry/gpu.tar.xz | cut -f1)" \
  "($(ls "$stage/gpu/bin" | wc -l) programs, $(ls "$stage/gpu/lib" | wc -l) libraries)"
