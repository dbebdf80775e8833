#!/usr/bin/env bash
# Installs what dptrain needs from Debian 12's archive. Idempotent and quiet when everything
# is already there. Runs apt-get as root (directly, or through sudo).
# --torch: also PyTorch (python3-torch) for dptrain.torch and its tests (tools/test.sh passes
# it; the container images' build stage does not need it).
set -euo pipefail

packages=(
  bazel-bootstrap bazel-rules-java               # Bazel 4.2.3 + the Java rules it registers
  g++ pkg-config
  libgrpc++-dev protobuf-compiler-grpc protobuf-compiler libprotobuf-dev
  libabsl-dev libgtest-dev
  zlib1g-dev                                     # gzip IDX files, CRC32 of shard checkpoints
  libpng-dev libjpeg62-turbo-dev                 # ImageFolder data sets (PNG and JPEG images)
  nlohmann-json3-dev                             # shard checkpoint manifests, traces, /status
  libcivetweb-dev                                # the /metrics and /status HTTP endpoint
  prometheus                                     # promtool + a real server in tests/metrics_test
  python3-matplotlib                             # tools/plot_curves.py (training curves)
  python3-pil                                    # Pillow: the resize reference in tests/onnx_e2e_test
  libopenblas-dev                                # CPU GEMMs
  libdnnl-dev                                    # oneDNN convolutions where they win (onednn_conv.h)
  libonnx-dev                                    # ONNX models (worker/graph/onnx_import.h)
  libssl-dev                                     # libcrypto: job token, ring HMAC, PEM checks
  openssl                                        # tools/make_certs.sh (and the tests' certificates)
  dataset-fashion-mnist                          # /usr/share/datasets/fashion-mnist
  bc procps                                      # used by the shell tests
  iproute2                                       # tests/netns_test.sh: ip netns, veth, tc
  python3-yaml docker-compose yamllint           # tests/deploy_*: compose/manifest checks
  clang-16 libfuzzer-16-dev libclang-rt-16-dev   # tests/fuzz: libFuzzer, ASan, UBSan runtimes
  libomp-16-dev                                  # tests/fuzz: omp.h for clang (onnx_import_fuzzer)
)
for arg in "$@"; do
  case "$arg" in
    --torch) packages+=(python3-torch) ;;      # dptrain.torch, tests/torch_workers_test
    *) echo "setup: unknown argument '$arg' (known: --torch)" >&2; exit 2 ;;
  esac
done

# `kubectl kustomize` for tests/deploy_k8s_test.sh, unless a kubectl is already installed.
# Best effort: Debian's kubernetes-client conflicts with other packages that ship
# /usr/bin/kubectl, and the test falls back to checking base/ without it.
want_kubectl=0
command -v kubectl >/dev/null || want_kubectl=1

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
((${#missing[@]} == 0 && want_kubectl == 0)) && exit 0

sudo=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "setup: need root to install: ${missing[*]}" >&2; exit 1; }
  sudo=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if ((want_kubectl)); then
  $sudo apt-get install -y -qq --no-install-recommends kubernetes-client >/dev/null 2>&1 ||
    echo "setup: kubernetes-client could not be installed; deploy_k8s_test checks base/ only" >&2
fi
