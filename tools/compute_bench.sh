#!/usr/bin/env bash
# Builds //tests/bench:compute_benchmark and measures, in this one invocation, our training
# throughput and peak memory beside PyTorch's (tools/bench_torch_compute.py, when Debian's
# python3-torch is installed) for every model x thread count, then writes OUT_DIR/compute.md
# (plus ours.csv and torch.csv). Each point runs ours then PyTorch back to back, each in a
# fresh process, so both see the same machine load.
# usage: tools/compute_bench.sh [OUT_DIR] [--models=mlp,lenet,resnet18] [--threads=1,2]
#                               [--batch_size=256] [--warmup=3] [--steps=20]
#                               [--resnet18_warmup=1] [--resnet18_steps=3] [--lr=0.01]
#                               [--rounds=1] [--resnet18_rounds=1]
# --rounds=N repeats every point N times (interleaved: all points, then again) and reports the
# median of the N per-round images/s and the largest peak memory, to damp a shared machine;
# resnet18 (seconds per step) runs in the first --resnet18_rounds rounds only.
set -euo pipefail
cd "$(dirname "$0")/.."
out="results/compute"
if [[ $# -gt 0 && "$1" != --* ]]; then
  out="$1"
  shift
fi
models="mlp,lenet,resnet18"
threads="1,2"
batch=256
rounds=1
resnet18_rounds=1
pass=()  # Flags both benchmarks take as they are.
for arg in "$@"; do
  case "$arg" in
    --models=*) models="${arg#--models=}" ;;
    --threads=*) threads="${arg#--threads=}" ;;
    --rounds=*) rounds="${arg#--rounds=}" ;;
    --resnet18_rounds=*) resnet18_rounds="${arg#--resnet18_rounds=}" ;;
    --batch_size=*)
      batch="${arg#--batch_size=}"
      pass+=("$arg")
      ;;
    --warmup=* | --steps=* | --resnet18_warmup=* | --resnet18_steps=* | \
      --lr=* | --seed=*) pass+=("$arg") ;;
    *)
      echo "compute_bench.sh: unknown argument $arg" >&2
      exit 2
      ;;
  esac
done

tools/setup.sh
bazel build //tests/bench:compute_benchmark
bin=bazel-bin/tests/bench/compute_benchmark
have_torch=0
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then have_torch=1; fi

mkdir -p "$out"
rm -f "$out/ours.csv" "$out/torch.csv"
notes=()
load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
started="$(date -u '+%Y-%m-%d %H:%M UTC')"
IFS=',' read -r -a model_list <<<"$models"
IFS=',' read -r -a thread_list <<<"$threads"
declare -A skipped=()
for ((round = 1; round <= rounds; round++)); do
  for m in "${model_list[@]}"; do
    [[ -z "${skipped[$m]:-}" ]] || continue
    [[ $m != resnet18 || $round -le $resnet18_rounds ]] || continue
    for t in "${thread_list[@]}"; do
      echo "== round $round/$rounds: $m, $t thread(s)" >&2
      set +e
      "$bin" --models="$m" --threads="$t" --csv="$out/ours.csv" "${pass[@]}" >"$out/last.log"
      rc=$?
      set -e
      cat "$out/last.log" >&2
      if grep -q '^Note: skipped' "$out/last.log"; then
        notes+=("$(grep '^Note: skipped' "$out/last.log" | sed 's/^Note: //')")
        skipped[$m]=1
        break  # CreateModel does not know the model: no point in other thread counts.
      fi
      [[ $rc -eq 0 ]] || notes+=("ours failed for $m, $t thread(s) (exit $rc)")
      if [[ $have_torch -eq 1 ]]; then
        /usr/bin/python3 tools/bench_torch_compute.py --models="$m" --threads="$t" \
          --csv="$out/torch.csv" "${pass[@]}" >&2 || notes+=("PyTorch failed for $m, $t thread(s)")
      fi
    done
  done
done
rm -f "$out/last.log"
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"
[[ $have_torch -eq 1 ]] || notes+=("PyTorch columns empty: /usr/bin/python3 cannot import torch (apt-get install python3-torch)")
torch_version="$(/usr/bin/python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)"
touch "$out/ours.csv" "$out/torch.csv"

{
  echo "# Compute benchmark: training images/s per worker model"
  echo
  echo "Measured $started on $(nproc) CPUs ($(lscpu | sed -n 's/^Model name: *//p' | head -1)),"
  echo "batch $batch, $rounds round(s) (resnet18: at most $resnet18_rounds), flags: ${pass[*]:-defaults}; load average before $load_before, after $load_after"
  echo "(the machine is shared: other jobs' load skews both columns). One step = forward +"
  echo "loss + backward + plain SGD update (w -= lr*g; PyTorch: zero_grad, forward,"
  echo "CrossEntropyLoss, backward, optimizer.step()), fixed synthetic batch, median over the"
  echo "timed steps after warm-up; each (model, threads) point in a fresh process, ours then"
  echo "PyTorch $torch_version back to back. Threads: the model's own math threads for ours"
  echo "(split over samples/channels, single-threaded BLAS inside), torch.set_num_threads plus"
  echo "OPENBLAS_NUM_THREADS and OMP_NUM_THREADS for PyTorch (its Linear layers run in OpenBLAS,"
  echo "whose own thread pool set_num_threads does not reach). Peak MiB ="
  echo "the child's getrusage ru_maxrss (PyTorch's includes ~200 MiB of the torch library)."
  echo
  [[ $rounds -eq 1 ]] || echo "images/s: median of the rounds (lowest-highest)."
  echo "Best-step ratio: ours/PyTorch of the fastest single step seen (least disturbed by load)."
  echo
  echo "| model | threads | ours images/s | PyTorch images/s | ours/PyTorch | best-step ratio | ours peak MiB | PyTorch peak MiB | steps (ours, PyTorch) |"
  echo "|---|---|---|---|---|---|---|---|---|"
  # Per (model, threads): median images/s over the rounds (range if several), largest peak.
  awk -F, -v rounds="$rounds" '
    function median(list, n,    v, i, j, x) {
      n = split(list, v, " ")
      for (i = 2; i <= n; i++) {
        x = v[i] + 0
        for (j = i - 1; j >= 1 && v[j] + 0 > x; j--) v[j + 1] = v[j]
        v[j + 1] = x
      }
      lo = v[1]; hi = v[n]
      return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    }
    function cell(list,    m) {
      if (list == "") return "n/a"
      m = median(list)
      return split(list, tmp, " ") > 1 ? sprintf("%.0f (%.0f-%.0f)", m, lo, hi) : sprintf("%.0f", m)
    }
    FNR == 1 { file++; next }
    file == 1 { key = $1 "," $2; if (!(key in ours)) order[++n] = key
                ours[key] = ours[key] " " $9; if ($10 + 0 > ours_rss[key]) ours_rss[key] = $10 + 0
                ours_steps[key] = $5; if ($13 + 0 > ours_best[key]) ours_best[key] = $13 + 0 }
    file == 2 { key = $1 "," $2; torch[key] = torch[key] " " $9
                if ($10 + 0 > torch_rss[key]) torch_rss[key] = $10 + 0; torch_steps[key] = $5
                if ($13 + 0 > torch_best[key]) torch_best[key] = $13 + 0 }
    END {
      for (i = 1; i <= n; i++) {
        key = order[i]; split(key, k, ",")
        ratio = (key in torch) ? sprintf("%.2f", median(ours[key]) / median(torch[key])) : "n/a"
        best = (key in torch) ? sprintf("%.2f", ours_best[key] / torch_best[key]) : "n/a"
        printf "| %s | %s | %s | %s | %s | %s | %.0f | %s | %s, %s |\n", k[1], k[2],
               cell(ours[key]), cell(torch[key]), ratio, best, ours_rss[key],
               (key in torch_rss) ? sprintf("%.0f", torch_rss[key]) : "n/a",
               ours_steps[key], (key in torch_steps) ? torch_steps[key] : "-"
      }
    }' <(echo header; tail -n +2 "$out/ours.csv") <(echo header; tail -n +2 "$out/torch.csv")
  for note in "${notes[@]}"; do
    echo
    echo "Note: $note"
  done
  echo
  echo "Per-step detail (step, train = forward+backward, sgd = update, in ms): ours.csv, torch.csv."
} >"$out/compute.md"
cat "$out/compute.md"
