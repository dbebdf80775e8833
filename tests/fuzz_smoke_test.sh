#!/usr/bin/env bash
# Every libFuzzer target of tests/fuzz/ (arguments: their paths): its crash reproducers
# replayed, then FUZZ_SECONDS (20) of fuzzing from its seed corpus, two targets at a time.
# Fails on any crash, sanitizer report, leak, timeout or FUZZ_CHECK. The targets are built
# with clang-16 (tools/setup.sh installs it); without it the build fails, loudly: this test
# never skips. Longer runs: tools/fuzz.sh.
set -euo pipefail
cd "$TEST_SRCDIR/$TEST_WORKSPACE"
(($# >= 6)) || { echo "fuzz_smoke_test: expected at least 6 fuzz targets, got $#: $*" >&2; exit 1; }
exec tests/fuzz/run_fuzzers.sh --source=tests/fuzz --seconds="${FUZZ_SECONDS:-20}" --jobs=2 \
  --work="$TEST_TMPDIR/fuzz" --artifacts="${TEST_UNDECLARED_OUTPUTS_DIR:-$TEST_TMPDIR}" "$@"
