#!/usr/bin/env bash
# Native peers for the communication benchmark, measured in the same run as
# tools/bench_peers.py: Open MPI's MPI_Allreduce over TCP on loopback
# (tools/peers/mpi_allreduce.c) and the Gloo library's TCP transport
# (tools/peers/gloo_allreduce.cc: its ring, and the best of every algorithm it offers).
# Built with plain mpicc/g++ into BUILD_DIR, not through Bazel (these peers are no part of
# `bazel test //...`). Best effort: a peer that is missing, fails to build, or fails its
# result check gets a row saying so, and this script still exits 0.
#
# Prints Markdown rows: | peer | ranks | size | time ms | busbw GB/s |
# busbw = bytes / seconds * 2(N-1)/N (nccl-tests), bytes = MIB MiB of fp32; median over
# REPS after one warm-up, each rep timed barrier-to-barrier as bench_peers.py does.
# usage: tools/bench_native_peers.sh [BUILD_DIR] [REPS]
#        tools/bench_native_peers.sh BUILD_DIR --build-only   (just build; tools/head_to_head.py)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 0
build="${1:-$(mktemp -d /tmp/bench_native_peers.XXXXXX)}"
reps="${2:-5}"
mkdir -p "$build"
ranks_list=(2 4)
mib_list=(16 64)

# Open MPI forced onto TCP: the ob1 PML (not UCX) over the tcp and self BTLs only (so no
# vader/shared memory), TCP restricted to the loopback interface.
mpi_flags=(--allow-run-as-root --oversubscribe --bind-to none
  --mca pml ob1 --mca btl "tcp,self" --mca btl_tcp_if_include lo)

row() { echo "| $1 | $2 | $3 | $4 | $5 |"; }

# Row with time and busbw from seconds.
timed_row() {  # peer ranks mib seconds
  awk -v peer="$1" -v n="$2" -v mib="$3" -v s="$4" 'BEGIN {
    printf "| %s | %d | %d MiB | %.1f | %.3f |\n", peer, n, mib, s * 1e3,
      mib * 1048576 / s * 2 * (n - 1) / n / 1e9 }'
}

mpi_peer() {
  local peer="OpenMPI TCP"
  if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
    row "$peer" - - "not installed (apt-get install openmpi-bin libopenmpi-dev)" -
    return
  fi
  if ! mpicc -O2 -o "$build/mpi_allreduce" tools/peers/mpi_allreduce.c \
      >"$build/mpi_build.log" 2>&1; then
    row "$peer" - - "build failed (see $build/mpi_build.log)" -
    return
  fi
  local n mib out seconds log
  for n in "${ranks_list[@]}"; do
    for mib in "${mib_list[@]}"; do
      log="$build/mpi_${n}_${mib}.log"
      out=$(timeout 300 mpirun "${mpi_flags[@]}" -np "$n" "$build/mpi_allreduce" "$mib" \
        "$reps" 2>"$log")
      echo "$out" >>"$log"
      seconds=$(awk '$1 == "seconds" { print $2 }' <<<"$out")
      if grep -q '^check ok' <<<"$out" && [[ -n "$seconds" ]]; then
        timed_row "$peer" "$n" "$mib" "$seconds"
      else
        row "$peer" "$n" "$mib MiB" "failed (see $log)" -
      fi
    done
  done
}

gloo_peer() {
  if [[ ! -e /usr/include/gloo/allreduce.h ]] || ! command -v g++ >/dev/null; then
    row "Gloo ring" - - "not installed (apt-get install libgloo-dev)" -
    return
  fi
  # Debian's libgloo-dev puts libgloo.so in /usr/lib (not the multiarch dir); both are on
  # the default linker path.
  if ! g++ -O2 -std=c++17 -o "$build/gloo_allreduce" tools/peers/gloo_allreduce.cc -lgloo \
      -pthread >"$build/gloo_build.log" 2>&1; then
    row "Gloo ring" - - "build failed (see $build/gloo_build.log)" -
    return
  fi
  local n mib out ring best log
  for n in "${ranks_list[@]}"; do
    for mib in "${mib_list[@]}"; do
      log="$build/gloo_${n}_${mib}.log"
      out=$(timeout 600 "$build/gloo_allreduce" "$n" "$mib" "$reps" 2>"$log")
      echo "$out" >>"$log"
      if ! grep -q '^check ok' <<<"$out"; then
        row "Gloo ring" "$n" "$mib MiB" "failed (see $log)" -
        continue
      fi
      ring=$(awk '$1 == "algo" && $2 == "ring" { print $3 }' <<<"$out")
      best=$(awk '$1 == "algo" && (b == "" || $3 < s) { b = $2; s = $3 } END { print b, s }' \
        <<<"$out")
      timed_row "Gloo ring" "$n" "$mib" "$ring"
      timed_row "Gloo best (${best% *})" "$n" "$mib" "${best#* }"
    done
  done
}

if [[ "$reps" == "--build-only" ]]; then
  ranks_list=()  # Build both programs, measure nothing.
fi
mpi_peer
gloo_peer
exit 0
