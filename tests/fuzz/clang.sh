#!/usr/bin/env bash
# The compiler of the fuzz targets (tests/fuzz/fuzz.bzl): clang++-16 with libFuzzer,
# AddressSanitizer and UndefinedBehaviorSanitizer. Bazel's C++ toolchain is gcc; these
# objects are built beside it, from the same sources, by this script only.
#   clang.sh compile SRC OBJ [-I DIR]...     one translation unit
#   clang.sh link OUT OBJ... [-lLIB]...      a fuzzer binary (libFuzzer's main)
# Fails loudly when clang-16 or its libFuzzer/sanitizer runtimes are missing: the fuzz
# smoke test must never pass by skipping.
set -euo pipefail

clang=${DPTRAIN_FUZZ_CLANG:-/usr/bin/clang++-16}
missing() {
  echo "tests/fuzz/clang.sh: ERROR: $1" >&2
  echo "  the fuzz targets need Debian's clang-16, libfuzzer-16-dev and libclang-rt-16-dev:" >&2
  echo "  run tools/setup.sh (or apt-get install clang-16 libfuzzer-16-dev libclang-rt-16-dev libomp-16-dev)" >&2
  exit 1
}
[[ -x $clang ]] || missing "$clang not found"

# -O1 -g: fast enough to fuzz, readable stack traces. Every UBSan finding is fatal, so a
# run that reports one fails; -fno-sanitize=function: uninstrumented system libraries
# (absl, protobuf, gRPC) call back through function pointers it cannot check.
flags=(-std=c++17 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined
  -fno-sanitize-recover=all -fno-sanitize=function -Wno-unused-command-line-argument)

mode=$1
shift
case $mode in
  compile)
    src=$1 obj=$2
    shift 2
    exec "$clang" "${flags[@]}" -fsanitize=fuzzer-no-link "$@" -c "$src" -o "$obj"
    ;;
  link)
    runtime=$("$clang" -print-resource-dir)/lib/linux/libclang_rt.fuzzer-x86_64.a
    [[ -f $runtime ]] || missing "libFuzzer runtime $runtime not found"
    out=$1
    shift
    exec "$clang" "${flags[@]}" -fsanitize=fuzzer "$@" -o "$out"
    ;;
  *)
    echo "usage: clang.sh compile SRC OBJ [FLAGS] | link OUT OBJS [LIBS]" >&2
    exit 2
    ;;
esac
