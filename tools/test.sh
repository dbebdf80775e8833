#!/usr/bin/env bash
# Installs dependencies, builds everything and runs the whole test suite; stops the Bazel
# server at the end. Extra arguments go to `bazel test` (e.g. a target pattern).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh --torch
status=0
bazel test //... "$@" || status=$?
# Tests that skipped something (e.g. GPU tests without a GPU) say so, not silently pass.
skipped=$(grep -l -E '^\[  SKIPPED \]|^SKIPPED' bazel-testlogs/*/*/test.log bazel-testlogs/*/test.log \
  bazel-testlogs/*/*/*/test.log 2>/dev/null || true)
for log in $skipped; do
  echo "SKIPPED in ${log#bazel-testlogs/}: $(grep -h -m1 -E 'Skipped|SKIPPED:' -A1 "$log" | tr '\n' ' ')"
done
bazel shutdown
exit $status
