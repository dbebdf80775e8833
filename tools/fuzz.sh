#!/usr/bin/env bash
# Longer fuzzing than the test suite's 20 s per target: builds the libFuzzer targets of
# tests/fuzz/ (clang-16; tools/setup.sh installs it) and runs them, JOBS at a time, each for
# SECONDS, keeping what they learn in WORK so that the next run goes on from there.
#   tools/fuzz.sh [--seconds=3600] [--jobs=2] [--work=/var/tmp/dptrain-fuzz] [NAME_fuzzer...]
# A crash stops nothing else; the summary at the end names it, prints its input and says
# where it was kept. Turn it into a regression test: copy the input into
# tests/fuzz/regressions/NAME_fuzzer/, fix the code, and //tests:fuzz_smoke_test replays it.
# To grow the checked-in seeds from a long run (keep them small):
#   bazel-bin/tests/fuzz/NAME_fuzzer -merge=1 tests/fuzz/corpus/NAME_fuzzer WORK/NAME_fuzzer
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=3600 jobs=2 work=/var/tmp/dptrain-fuzz names=()
for arg in "$@"; do
  case $arg in
    --seconds=*) seconds=${arg#*=} ;;
    --jobs=*) jobs=${arg#*=} ;;
    --work=*) work=${arg#*=} ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    --*) echo "tools/fuzz.sh: unknown flag $arg" >&2; exit 2 ;;
    *) names+=("$arg") ;;
  esac
done

tools/setup.sh
bazel build //tests/fuzz:fuzzers
if ((${#names[@]} == 0)); then
  mapfile -t names < <(bazel query 'kind("_dptrain_fuzzer rule", //tests/fuzz:*)' 2>/dev/null |
    sed 's|.*:||')
fi
fuzzers=()
for n in "${names[@]}"; do fuzzers+=("bazel-bin/tests/fuzz/$n"); done
exec tests/fuzz/run_fuzzers.sh --source=tests/fuzz --seconds="$seconds" --jobs="$jobs" \
  --work="$work" --artifacts="$work/crashes" "${fuzzers[@]}"
