#!/usr/bin/env bash
# Installs dependencies, builds everything and runs the whole test suite; stops the Bazel
# server at the end. Extra arguments go to `bazel test` (e.g. a target pattern).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
status=0
bazel test //... "$@" || status=$?
bazel shutdown
exit $status
