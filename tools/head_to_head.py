#!/usr/bin/python3
"""Head to head, in interleaved rounds so that both sides see the same machine load:

1. Our ring all-reduce against every all-reduce peer installed here, point by point. For each
   round and point (ranks 2 and 4 x 16 and 64 MiB of fp32), back to back: our bare ring
   (comm_benchmark --modes=ring), torch.distributed gloo, Open MPI over TCP and the Gloo
   library (its ring and the best of every algorithm it has; tools/bench_native_peers.sh
   builds them). Median busbw (nccl-tests: bytes/s x 2(N-1)/N) over the rounds; the last row
   is ours over the best peer's.
2. A PS push+pull of 64 MiB through one shard (1 worker) against one loopback TCP stream
   (iperf3, 2 s), back to back per round: the worker's link moves 64 MiB up and 64 MiB down,
   so its throughput is 128 MiB / time; algbw (64 MiB / time) is shown too.

usage: tools/head_to_head.py --out=DIR [--rounds=3] [--reps=5]
(expects bazel-bin/tests/bench/comm_benchmark; tools/comm_bench.sh builds it and calls this.)
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_peers  # noqa: E402

POINTS = [(2, 16), (2, 64), (4, 16), (4, 64)]
MPI_FLAGS = ["--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "--mca", "pml",
             "ob1", "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo"]


def busbw(n, mib, seconds):
    return mib * (1 << 20) / seconds * 2 * (n - 1) / n / 1e9


def ours(n, mib, reps, out):
    res = subprocess.run(["bazel-bin/tests/bench/comm_benchmark", "--modes=ring",
                          f"--workers={n}", f"--sizes_mib={mib}", "--models=", f"--reps={reps}",
                          f"--out={out}"], capture_output=True, text=True, timeout=600)
    for line in res.stdout.splitlines():
        f = [x.strip() for x in line.split("|")]
        if len(f) > 7 and f[1] == "ring" and f[2] == str(n):
            return float(f[7])
    raise RuntimeError(f"comm_benchmark ring {n}x{mib}: no result\n{res.stderr[-2000:]}")


def ps_one_shard(mib, reps, out):
    """Seconds of one push+pull of `mib` MiB, 1 worker, 1 shard."""
    res = subprocess.run(["bazel-bin/tests/bench/comm_benchmark", "--modes=ps", "--workers=1",
                          "--shards=1", f"--sizes_mib={mib}", "--models=", f"--reps={reps}",
                          f"--out={out}"], capture_output=True, text=True, timeout=600)
    for line in res.stdout.splitlines():
        f = [x.strip() for x in line.split("|")]
        if len(f) > 5 and f[1] == "ps" and f[2] == "1":
            return float(f[5]) / 1e3
    raise RuntimeError(f"comm_benchmark ps 1x{mib}: no result\n{res.stderr[-2000:]}")


def mpi(build, n, mib, reps):
    exe = os.path.join(build, "mpi_allreduce")
    if not os.path.exists(exe):
        return None
    res = subprocess.run(["mpirun", *MPI_FLAGS, "-np", str(n), exe, str(mib), str(reps)],
                         capture_output=True, text=True, timeout=300)
    m = re.search(r"^seconds (\S+)", res.stdout, re.M)
    if not m or "check ok" not in res.stdout:
        return None
    return busbw(n, mib, float(m.group(1)))


def gloo_native(build, n, mib, reps):
    """{algorithm: busbw}"""
    exe = os.path.join(build, "gloo_allreduce")
    if not os.path.exists(exe):
        return {}
    res = subprocess.run([exe, str(n), str(mib), str(reps)], capture_output=True, text=True,
                         timeout=600)
    if "check ok" not in res.stdout:
        return {}
    return {m.group(1): busbw(n, mib, float(m.group(2)))
            for m in re.finditer(r"^algo (\S+) (\S+)", res.stdout, re.M)}


def ps_vs_stream(a):
    mib = 64
    ps, stream = [], []
    for r in range(a.rounds):
        gbps = bench_peers.iperf3(seconds=2)
        if gbps is not None:
            stream.append(gbps)
        ps.append(ps_one_shard(mib, a.reps, os.path.join(a.out, "ps-scratch")))
        print(f"round {r + 1} ps {mib} MiB: {ps[-1] * 1e3:.1f} ms, iperf3 "
              f"{stream[-1] if stream else float('nan'):.2f} GB/s", file=sys.stderr, flush=True)
    t = statistics.median(ps)
    link = 2 * mib * (1 << 20) / t / 1e9
    algbw = mib * (1 << 20) / t / 1e9
    lines = ["", f"PS push+pull of {mib} MiB through one shard (1 worker) against one loopback TCP "
             f"stream, median of {a.rounds} interleaved rounds:", "",
             "| | time ms | GB/s | / TCP stream |", "|---|---|---|---|"]
    if stream:
        g = statistics.median(stream)
        lines += [f"| iperf3 one TCP stream | - | {g:.3f} | 1.00 |",
                  f"| PS link (128 MiB moved) | {t * 1e3:.1f} | {link:.3f} | **{link / g:.2f}** |",
                  f"| PS algbw (64 MiB) | {t * 1e3:.1f} | {algbw:.3f} | {algbw / g:.2f} |"]
    else:
        lines += ["| iperf3 one TCP stream | - | not installed | - |",
                  f"| PS link (128 MiB moved) | {t * 1e3:.1f} | {link:.3f} | - |"]
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=5)
    a = p.parse_args()
    build = os.path.join(a.out, "peers-build")
    os.makedirs(build, exist_ok=True)
    subprocess.run(["tools/bench_native_peers.sh", build, "--build-only"], check=False,
                   stdout=subprocess.DEVNULL)
    try:
        import torch.distributed  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
    samples = {}  # (peer, point) -> [busbw per round]

    def add(peer, point, value):
        if value is not None:
            samples.setdefault((peer, point), []).append(value)

    for r in range(a.rounds):
        for point in POINTS:
            n, mib = point
            add("dptrain ring", point, ours(n, mib, a.reps, os.path.join(a.out, "ring-scratch")))
            if have_torch:
                add("torch.distributed gloo", point, bench_peers.gloo(n, mib, a.reps)[1])
            add("OpenMPI TCP", point, mpi(build, n, mib, a.reps))
            algos = gloo_native(build, n, mib, a.reps)
            add("Gloo ring", point, algos.get("ring"))
            if algos:
                add("Gloo best algorithm", point, max(algos.values()))
            print(f"round {r + 1} {n}x{mib} MiB: " + ", ".join(
                f"{peer} {v[-1]:.3f}" for (peer, pt), v in samples.items() if pt == point),
                file=sys.stderr, flush=True)
    peers = []
    for (peer, _) in samples:
        if peer not in peers:
            peers.append(peer)
    med = {k: statistics.median(v) for k, v in samples.items()}
    lines = [f"Ring all-reduce against every peer installed here: busbw GB/s, median of "
             f"{a.rounds} interleaved rounds (each round runs all peers back to back per point).",
             "", "| | " + " | ".join(f"{n} ranks {mib} MiB" for n, mib in POINTS) + " |",
             "|---|" + "---|" * len(POINTS)]
    for peer in peers:
        cells = [f"{med[(peer, pt)]:.3f}" if (peer, pt) in med else "-" for pt in POINTS]
        lines.append(f"| {peer} | " + " | ".join(cells) + " |")
    ratios = []
    for pt in POINTS:
        others = [med[(peer, pt)] for peer in peers
                  if peer != "dptrain ring" and (peer, pt) in med]
        mine = med.get(("dptrain ring", pt))
        ratios.append(f"{mine / max(others):.2f}" if others and mine else "-")
    lines.append("| **dptrain / best peer** | " + " | ".join(ratios) + " |")
    lines += ps_vs_stream(a)
    text = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "head_to_head.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
