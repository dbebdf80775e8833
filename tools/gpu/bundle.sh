#!/usr/bin/env bash
# Here: builds what the lent GPU machine should run (the GPU tests, the binaries, the GPU
# benchmark) and packs it, with Fashion-MNIST and every shared library it needs that is not
# glibc, the CUDA driver, cuBLAS or cuDNN, into .carry/gpu.tar.xz (ignored by git; the GPU
# machine lacks Debian's gRPC/protobuf/Abseil/OpenBLAS). cuBLAS and cuDNN (~1 GB) stay
# behind: the GPU machine has CUDA 13's, with PyTorch, and check.sh finds them there.
# Then, with the device tool:
#   run(command="tools/gpu/check.sh", carry=[".carry"])
# usage: tools/gpu/bundle.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ -x /usr/local/cuda/bin/nvcc || -n "${CUDA_PATH:-}" ]] ||
  { echo "gpu/bundle: no CUDA toolkit here: the bundle would hold no GPU code" >&2; exit 1; }
targets=(//worker:gpu_worker //worker/cuda:libdptrain_cuda.so //server:ps_server
         //worker/cuda:device_probe_test
         //worker/cuda:kernels_test //worker/cuda:cuda_raw_allocator_test
         //worker/cuda:gpu_network_test //worker/cuda:gpu_graph_test
         //worker/cuda:gpu_any_shape_test //worker/cuda:gpu_recurrent_test
         //worker/cuda:held_data_test
         //worker/cuda:gpu_parity_test
         //worker/cuda:gpu_benchmark //tests/bench:compute_benchmark
         //tests/bench:sparse_shard_bench
         //python/native:libdptrain_c.so)
bazel build "${targets[@]}"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/gpu/bin" "$stage/gpu/lib"
built=()
for t in "${targets[@]}"; do
  path="bazel-bin/${t#//}"
  path="${path/://}"
  built+=("$path")
  cp -L "$path" "$stage/gpu/bin/"
done
# Libraries: everything ldd resolves except glibc's own and the driver (the GPU machine's
# newer glibc and its driver must be used). ldd runs on the built files, whose RUNPATH
# ($ORIGIN/../_solib_k8) finds the tests' Bazel-made libraries; the copies cannot.
for bin in "${built[@]}"; do
  if ldd "$bin" | grep -q "not found"; then
    echo "gpu/bundle: $bin: $(ldd "$bin" | grep "not found" | head -3)" >&2
    exit 1
  fi
  ldd "$bin" | awk '$3 ~ /^\// { print $3 }'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|libcuda.so*) ;;
    libcublas*|libcudnn*) ;;
    *) cp -L "$lib" "$stage/gpu/lib/" ;;
  esac
done
cp tools/gpu/torch_resnet.py tools/gpu/torch_e2e.py tools/gpu/e2e_table.py "$stage/gpu/"
data=/usr/share/datasets/fashion-mnist  # Debian's dataset-fashion-mnist (tools/setup.sh)
[[ -s "$data/train-images-idx3-ubyte.gz" ]] || { echo "gpu/bundle: no Fashion-MNIST in $data" >&2; exit 1; }
mkdir -p "$stage/gpu/data"
cp "$data"/*-ubyte.gz "$stage/gpu/data/"
# Every copy must find its libraries in the bundle (cuBLAS/cuDNN: from the toolkit here).
for bin in "$stage"/gpu/bin/*; do
  missing=$(LD_LIBRARY_PATH="$stage/gpu/lib" ldd "$bin" | grep "not found" || true)
  [[ -z "$missing" ]] || { echo "gpu/bundle: $(basename "$bin") lacks: $missing" >&2; exit 1; }
done
mkdir -p .carry
tar -C "$stage" -cf - gpu | xz -T2 -6 >.carry/gpu.tar.xz
echo "gpu/bundle: .carry/gpu.tar.xz, $(du -h .carry/gpu.tar.xz | cut -f1)" \
  "($(ls "$stage/gpu/bin" | wc -l) programs, $(ls "$stage/gpu/lib" | wc -l) libraries)"
