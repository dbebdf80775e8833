#!/usr/bin/env bash
# Prints the export lines that make `import dptrain.torch` work from a built checkout
# (bazel build //python/native:libdptrain_c.so first):
#   eval "$(tools/python_env.sh)"
# PYTHONPATH gets the checkout's python/ folder; DPTRAIN_NATIVE_LIB names the C library.
# The package needs PyTorch (Debian: python3-torch) and nothing else; the library links no
# libtorch and no libpython, so any Python 3 with any PyTorch imports the same build.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
lib="$root/bazel-bin/python/native/libdptrain_c.so"
if [[ ! -f "$lib" ]]; then
  echo "python_env: $lib is not built: bazel build //python/native:libdptrain_c.so" >&2
  exit 1
fi
printf 'export PYTHONPATH=%q${PYTHONPATH:+:$PYTHONPATH}\n' "$root/python"
printf 'export DPTRAIN_NATIVE_LIB=%q\n' "$lib"
