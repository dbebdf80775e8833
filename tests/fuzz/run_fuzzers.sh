#!/usr/bin/env bash
# Runs libFuzzer targets built by tests/fuzz/fuzz.bzl: for each, first replays its crash
# reproducers (regressions/NAME/*, each must pass), then fuzzes for --seconds starting from
# its seeds (corpus/NAME/), its dictionary (NAME.dict, if any; NAME.max_len, a larger input
# size than the default 4096) and whatever an earlier run
# left in --work. Fails, printing the
# crash report and keeping the input, if any target crashes, leaks, times out, runs out of
# memory or breaks one of its FUZZ_CHECKs.
#   run_fuzzers.sh --source=DIR [--seconds=20] [--jobs=2] [--work=DIR] [--artifacts=DIR] FUZZER...
# --source: the folder holding corpus/ and regressions/ (tests/fuzz). Used by
# //tests:fuzz_smoke_test (20 s each) and tools/fuzz.sh (as long as you like).
set -euo pipefail

seconds=20 jobs=2 source="" work="" artifacts=""
fuzzers=()
for arg in "$@"; do
  case $arg in
    --seconds=*) seconds=${arg#*=} ;;
    --jobs=*) jobs=${arg#*=} ;;
    --source=*) source=${arg#*=} ;;
    --work=*) work=${arg#*=} ;;
    --artifacts=*) artifacts=${arg#*=} ;;
    --*) echo "run_fuzzers.sh: unknown flag $arg" >&2; exit 2 ;;
    *) fuzzers+=("$arg") ;;
  esac
done
if [[ -z $source || ${#fuzzers[@]} -eq 0 ]]; then
  echo "usage: run_fuzzers.sh --source=DIR [--seconds=N] [--jobs=N] [--work=DIR] FUZZER..." >&2
  exit 2
fi
work=${work:-$(mktemp -d)}
artifacts=${artifacts:-$work/artifacts}
mkdir -p "$work" "$artifacts"

# Readable stack traces without llvm-symbolizer: binutils' addr2line (there with g++).
export ASAN_SYMBOLIZER_PATH=${ASAN_SYMBOLIZER_PATH:-/usr/bin/addr2line}
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=0:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# A fuzz target is one process; its sources are also compiled with -O1, so one core each.
flags=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1
  -print_funcs=0 -max_len=4096)

# Runs one target; writes its log to $work/NAME.log and its verdict to $work/NAME.result.
run_one() {
  local bin=$1 name
  name=$(basename "$bin")
  local log=$work/$name.log corpus=$source/corpus/$name regress=$source/regressions/$name
  mkdir -p "$work/$name"
  : >"$log"
  if [[ ! -d $corpus ]] || [[ -z $(ls -A "$corpus") ]]; then
    echo "FAIL (no seed corpus at $corpus)" >"$work/$name.result"
    return
  fi
  local replay=()
  [[ -d $regress ]] && replay=("$regress"/*)
  if ((${#replay[@]})) && [[ -e ${replay[0]} ]]; then
    if ! "$bin" "${flags[@]}" "${replay[@]}" >>"$log" 2>&1; then
      echo "FAIL (a regression input crashes again, see above)" >"$work/$name.result"
      return
    fi
  fi
  local dict=()
  [[ -f $source/$name.dict ]] && dict=(-dict="$source/$name.dict")
  # NAME.max_len: a larger input size for targets whose seeds are larger than 4 KiB (whole
  # files such as ONNX models; libFuzzer cuts seeds to -max_len).
  [[ -f $source/$name.max_len ]] && dict+=(-max_len="$(<"$source/$name.max_len")")
  local dirs=("$work/$name" "$corpus")
  [[ -d $regress ]] && dirs+=("$regress")
  if "$bin" "${flags[@]}" "${dict[@]}" -max_total_time="$seconds" -artifact_prefix="$artifacts/$name-" \
    "${dirs[@]}" >>"$log" 2>&1; then
    local runs cov
    runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')
    echo "ok (${runs:-?} inputs, coverage ${cov:-?} edges, corpus $(ls "$work/$name" | wc -l) new)" \
      >"$work/$name.result"
  else
    echo "FAIL (crash, leak, timeout, out of memory or FUZZ_CHECK; input kept in $artifacts)" \
      >"$work/$name.result"
  fi
}

pids=()
for bin in "${fuzzers[@]}"; do
  [[ -x $bin ]] || { echo "run_fuzzers.sh: $bin is not an executable fuzzer" >&2; exit 2; }
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
  run_one "$bin" &
  pids+=($!)
done
wait

status=0
echo "fuzzing, ${seconds}s per target (libFuzzer, ASan + UBSan):"
for bin in "${fuzzers[@]}"; do
  name=$(basename "$bin")
  result=$(cat "$work/$name.result" 2>/dev/null || echo "FAIL (no result)")
  printf '  %-28s %s\n' "$name" "$result"
  if [[ $result != ok* ]]; then
    status=1
    echo "---- $name: end of its log ($work/$name.log) ----"
    grep -v -E '^#[0-9]+|^INFO:|Uses: ' "$work/$name.log" | tail -60 || true
    for a in "$artifacts/$name"-*; do
      [[ -e $a ]] || continue
      echo "---- input $a ($(stat -c %s "$a") bytes), base64:"
      head -c 3000 "$a" | base64
      echo "---- to keep it as a regression: cp $a tests/fuzz/regressions/$name/"
    done
  fi
done
exit $status
