"""dptrain.torch's row-sparse tables (dpt.SparseEmbedding) against the same table pushed
dense through the same shards, and the sparse path's bytes per shard against one plain TCP
stream on loopback: in one run, interleaved rounds, medians over the rounds (issue 29).

1. A ROWS x DIM fp32 table on 2 ps_server shards (--optimizer=sgd), TOUCHED unique ids per
   step spread over the table (a fresh random sample each step), WORKERS workers:
   - sparse: dpt.SparseEmbedding(optimizer="sgd"): forward pulls the touched rows, push()
     sends their gradients; the shards update just those rows.
   - dense: the same ROWS x DIM table as one nn.Parameter (F.embedding, so its gradient is
     dense, as nn.Embedding's) trained with dpt.ServerOptimizer: every step pushes the whole
     gradient and pulls the whole table.
   The step time of each (the slowest worker's mean step over the round) and their ratio.
2. The sparse path per shard: rows/s and row bytes/s (pulled + pushed, all workers; from the
   ids each worker sent, checked against the shards' own dptrain_ps_sparse_rows_*_total
   counters), against one Python TCP stream on loopback (sendall of 4 MiB chunks to a
   receiver process doing recv_into), measured in the same round.

Before the timed steps the sparse workers pull the whole table once (in chunks), so the
shards hold every row, as the dense shards do, and the timed steps see no first-touch row
creation (--prefill=0 leaves it out).

usage: eval "$(tools/python_env.sh)"; /usr/bin/python3 tests/bench/sparse_bench.py \\
         [--reps=3] [--rows=2000000] [--dim=64] [--touched=20000] [--workers=1] [--shards=2]
         [--sparse_steps=40] [--dense_steps=4] [--warmup=2] [--tcp_mb=512] [--threads=1]
         [--prefill=1] [--lr=0.01] [--out=FILE]
quick: ... sparse_bench.py --reps=2 --rows=200000 --touched=2000 --sparse_steps=10 \\
         --dense_steps=2 --tcp_mb=64
(a benchmark: run it on a quiet machine; it prints the load average before and after.)"""

import atexit
import ctypes
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
PS_SERVER = os.path.join(ROOT, "bazel-bin", "server", "ps_server")
DEFAULTS = {"reps": 3, "rows": 2_000_000, "dim": 64, "touched": 20_000, "workers": 1,
            "shards": 2, "sparse_steps": 40, "dense_steps": 4, "warmup": 2, "tcp_mb": 512,
            "threads": 1, "prefill": 1, "lr": 0.01, "out": ""}
CHUNK = 4 << 20  # The TCP stream's send and receive size.
PREFILL_ROWS = 1 << 17  # Ids per pull while the sparse workers pull the whole table once.

_children = []  # Every process this run started; all are stopped on exit, error or signal.
_scratch = None  # Logs and port files of this run (the driver makes it; kept on failure).


def _die_with_parent():
    """In each child (before exec): SIGKILL when this script dies, even by SIGKILL."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def spawn(args, **kwargs):
    p = subprocess.Popen(args, preexec_fn=_die_with_parent, **kwargs)
    _children.append(p)
    return p


def stop(processes):
    for p in processes:
        if p.poll() is None:
            p.terminate()
    for p in processes:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        if p in _children:
            _children.remove(p)


def _stop_all(*_):
    stop(list(_children))


def _on_signal(signum, _frame):
    _stop_all()
    if _scratch:
        shutil.rmtree(_scratch, ignore_errors=True)
    sys.exit(128 + signum)


def loadavg():
    with open("/proc/loadavg") as f:
        return f.read().strip()


def fail(message):
    where = f"\n(logs in {_scratch})" if _scratch else ""
    raise SystemExit(f"sparse_bench: {message}{where}")


def wait_for_file(path, process, what, log, timeout=60):
    deadline = time.time() + timeout
    while not (os.path.exists(path) and os.path.getsize(path)):
        if process.poll() is not None or time.time() > deadline:
            fail(f"{what} did not start (exit {process.poll()}): {tail(log)}")
        time.sleep(0.05)
    return open(path).read().strip()


def tail(path, n=1500):
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return ""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- The shards.

def start_shards(flags, tag):
    """flags["shards"] ps_servers (sgd, BSP, metrics on a free port); returns (processes,
    addresses, metrics ports, logs)."""
    procs, addresses, metrics, logs = [], [], [], []
    for s in range(flags["shards"]):
        base = os.path.join(_scratch, f"{tag}.shard{s}")
        log = base + ".log"
        p = spawn([PS_SERVER, "--host=127.0.0.1", "--port=0", f"--port_file={base}.port",
                   "--metrics_port=0", "--metrics_bind_address=127.0.0.1",
                   f"--metrics_port_file={base}.metrics",
                   f"--shard={s}", f"--num_shards={flags['shards']}",
                   f"--num_workers={flags['workers']}", "--optimizer=sgd", f"--lr={flags['lr']}",
                   "--sync=bsp", "--step_timeout=300s"],
                  stdout=open(log, "w"), stderr=subprocess.STDOUT)
        procs.append(p)
        logs.append(log)
    for s, p in enumerate(procs):
        base = os.path.join(_scratch, f"{tag}.shard{s}")
        addresses.append("127.0.0.1:" + wait_for_file(base + ".port", p, f"shard {s}", logs[s]))
        metrics.append(int(wait_for_file(base + ".metrics", p, f"shard {s}'s metrics",
                                         logs[s])))
    return procs, addresses, metrics, logs


def shard_counters(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    values = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].startswith("dptrain_ps_sparse_rows_"):
            values[parts[0]] = int(float(parts[1]))
    return values


# ---- One worker (a child process: `sparse_bench.py worker CONFIG RANK FLAGS_JSON`).

def worker(config, rank, flags):
    import torch
    import torch.nn.functional as F
    import dptrain.torch as dpt
    torch.set_num_threads(flags["threads"])
    rows, dim, touched = flags["rows"], flags["dim"], flags["touched"]
    warmup = flags["warmup"]
    steps = flags["sparse_steps"] if config == "sparse" else flags["dense_steps"]
    # TOUCHED unique ids per step, a fresh sample of the whole table each step (each rank its
    # own), drawn before anything is timed.
    g = torch.Generator().manual_seed(1000 * rank + 7)
    batches = [torch.randperm(rows, generator=g)[:touched] for _ in range(warmup + steps)]
    dpt.init()
    if config == "sparse":
        emb = dpt.SparseEmbedding(rows, dim, "bench", optimizer="sgd", lr=flags["lr"])
        if flags["prefill"] and rank == 0:  # The shards hold every row, as dense ones do.
            with torch.no_grad():
                for at in range(0, rows, PREFILL_ROWS):
                    emb(torch.arange(at, min(rows, at + PREFILL_ROWS)))

        def step(ids):
            emb(ids).sum().backward()  # The pull, then the touched rows' gradients.
            emb.push()                 # To the shards, which apply sgd to those rows.
    else:
        table = torch.nn.Parameter(torch.empty(rows, dim).normal_(generator=g))
        opt = dpt.ServerOptimizer([("table", table)])

        def step(ids):
            opt.zero_grad()
            F.embedding(ids, table).sum().backward()  # A dense ROWS x DIM gradient.
            opt.step()  # Pushes it whole, loads the whole table the shards computed.
    # Rows per shard from this rank's ids (row mod shards, as the shards split): the timed
    # steps', and all steps' (warm-up included) for the check against the shards' counters.
    per_shard, all_steps = [0] * flags["shards"], [0] * flags["shards"]
    for i, ids in enumerate(batches):
        counts = torch.bincount(ids % flags["shards"], minlength=flags["shards"]).tolist()
        all_steps = [a + c for a, c in zip(all_steps, counts)]
        if i >= warmup:
            per_shard = [a + c for a, c in zip(per_shard, counts)]
    times = []
    for i, ids in enumerate(batches):
        start = time.perf_counter()
        step(ids)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    dpt.shutdown()
    print(json.dumps({"times": times, "rows_per_shard": per_shard,
                      "all_rows_per_shard": all_steps}), flush=True)


def run_config(config, flags, rep):
    """One round of `config` on fresh shards; returns (mean step seconds of the slowest
    worker, per-shard rows pulled over the timed steps (all workers), counter check)."""
    tag = f"{config}{rep}"
    shards, addresses, metrics, shard_logs = start_shards(flags, tag)
    try:
        env = dict(os.environ, DPTRAIN_MODE="ps", DPTRAIN_PS=",".join(addresses),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                   WORLD_SIZE=str(flags["workers"]), LOCAL_WORLD_SIZE=str(flags["workers"]),
                   DPTRAIN_TIMEOUT="600", OMP_NUM_THREADS=str(flags["threads"]),
                   DPTRAIN_JOB_ID=f"sparse_bench_{tag}")
        procs, logs = [], []
        for r in range(flags["workers"]):
            log = os.path.join(_scratch, f"{tag}.worker{r}.log")
            procs.append(spawn([sys.executable, os.path.abspath(__file__), "worker", config,
                                str(r), json.dumps(flags)],
                               env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                               stdout=subprocess.PIPE, stderr=open(log, "w"), text=True))
            logs.append(log)
        results = []
        for r, p in enumerate(procs):
            out, _ = p.communicate(timeout=3600)
            if p.returncode != 0:
                fail(f"{config} round {rep + 1}, worker {r}: exit {p.returncode}: {tail(logs[r])}"
                     f"\nshard 0 log: {tail(shard_logs[0], 800)}")
            results.append(json.loads(out.strip().splitlines()[-1]))
        step_s = max(statistics.mean(res["times"]) for res in results)  # The slowest rank.
        rows = [sum(res["rows_per_shard"][s] for res in results) for s in range(len(shards))]
        check = ""
        if config == "sparse":
            # The shards' own counts against the ids the workers sent: every step's rows
            # pushed, and pulled plus the prefill's.
            every = [sum(res["all_rows_per_shard"][s] for res in results)
                     for s in range(len(shards))]
            prefill = [len(range(s, flags["rows"], flags["shards"])) if flags["prefill"] else 0
                       for s in range(len(shards))]
            counters = [shard_counters(m) for m in metrics]
            pulled = [c.get("dptrain_ps_sparse_rows_pulled_total", -1) for c in counters]
            pushed = [c.get("dptrain_ps_sparse_rows_pushed_total", -1) for c in counters]
            want_pulled = [e + p for e, p in zip(every, prefill)]
            check = ("shard counters agree" if pulled == want_pulled and pushed == every else
                     f"shard counters DIFFER: pulled {pulled} (want {want_pulled}), pushed "
                     f"{pushed} (want {every})")
        return step_s, rows, check
    finally:
        stop(shards)


# ---- One plain TCP stream on loopback.

def tcp_receiver():
    """Child: listens on a free loopback port (printed), receives until the sender shuts its
    side, answers the byte count."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        print(listener.getsockname()[1], flush=True)
        conn, _ = listener.accept()
        with conn:
            buffer = memoryview(bytearray(CHUNK))
            total = 0
            while True:
                n = conn.recv_into(buffer)
                if n == 0:
                    break
                total += n
            conn.sendall(str(total).encode())


def tcp_stream(megabytes):
    """Bytes/s of one TCP stream on loopback: `megabytes` MiB in sendall(4 MiB) chunks, from
    the first byte sent to the receiver's answer that it has them all."""
    receiver = spawn([sys.executable, os.path.abspath(__file__), "tcp_receiver"],
                     stdout=subprocess.PIPE, text=True)
    try:
        port = int(receiver.stdout.readline())
        payload = memoryview(bytearray(os.urandom(CHUNK)))
        total = (megabytes << 20) // CHUNK * CHUNK
        with socket.create_connection(("127.0.0.1", port)) as s:
            start = time.perf_counter()
            for _ in range(total // CHUNK):
                s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
            answer = s.recv(64)
            seconds = time.perf_counter() - start
        if int(answer) != total:
            fail(f"TCP receiver got {answer!r} bytes of {total}")
        return total / seconds
    finally:
        stop([receiver])


# ---- The driver.

def main():
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "tcp_receiver":
        tcp_receiver()
        return
    flags = dict(DEFAULTS)
    for a in sys.argv[1:]:
        key, _, value = a.lstrip("-").partition("=")
        if key not in flags:
            fail(f"unknown flag {a} (known: {', '.join('--' + k for k in DEFAULTS)})")
        flags[key] = type(DEFAULTS[key])(value)
    if flags["touched"] > flags["rows"]:
        fail("--touched must not exceed --rows")
    if not os.path.exists(PS_SERVER):
        fail(f"{PS_SERVER} is not built: bazel build //server:ps_server "
             "//python/native:libdptrain_c.so")
    global _scratch
    _scratch = tempfile.mkdtemp(prefix="sparse_bench.")
    atexit.register(_stop_all)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)
    import torch
    rows, dim, touched, shards = flags["rows"], flags["dim"], flags["touched"], flags["shards"]
    row_bytes = dim * 4
    load_before = loadavg()
    shown = " ".join(f"--{k}={v}" for k, v in flags.items() if k != "out")
    lines = [f"# tests/bench/sparse_bench.py {' '.join(sys.argv[1:])}",
             f"# flags: {shown}",
             f"# {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, torch "
             f"{torch.__version__}, python {sys.version.split()[0]}, nproc "
             f"{len(os.sched_getaffinity(0))} ({os.cpu_count()} cores), {socket.gethostname()}",
             f"# /proc/loadavg before: {load_before}",
             f"# table {rows:,} x {dim} fp32 ({rows * row_bytes / 2**20:,.0f} MiB), "
             f"{touched:,} unique ids per step per worker ({100 * touched / rows:.2g} % of the "
             f"rows), {shards} shards (ps_server --optimizer=sgd --lr={flags['lr']} --sync=bsp), "
             f"{flags['workers']} worker(s) x {flags['threads']} thread(s); sgd on both paths; "
             f"prefill {'on' if flags['prefill'] else 'off'}",
             f"# per round: sparse {flags['sparse_steps']} timed steps, dense "
             f"{flags['dense_steps']} (after {flags['warmup']} warm-up steps each), TCP "
             f"{flags['tcp_mb']} MiB; step time = the slowest worker's mean step"]
    print("\n".join(lines), flush=True)
    sparse_s, dense_s, tcp_bps, sparse_rows, checks = [], [], [], [], []
    for rep in range(flags["reps"]):
        s, rows_per_shard, check = run_config("sparse", flags, rep)
        sparse_s.append(s)
        sparse_rows.append(rows_per_shard)
        checks.append(check)
        d, _, _ = run_config("dense", flags, rep)
        dense_s.append(d)
        t = tcp_stream(flags["tcp_mb"])
        tcp_bps.append(t)
        print(f"round {rep + 1}: sparse {s * 1e3:.1f} ms/step ({check}), dense "
              f"{d * 1e3:.0f} ms/step ({d / s:.1f}x), TCP stream {t / 1e6:,.0f} MB/s", flush=True)
    load_after = loadavg()
    summary_at = len(lines)
    lines.append(f"# /proc/loadavg after: {load_after}")
    # Rows and row bytes per shard per second, per round (pulled rows = pushed rows).
    steps = flags["sparse_steps"]
    per_round = []  # (rows/s, bytes/s) of the busiest shard... and the mean shard.
    for s, rows_per_shard in zip(sparse_s, sparse_rows):
        seconds = s * steps
        rates = [2 * n / seconds for n in rows_per_shard]  # Pulled + pushed.
        per_round.append((statistics.mean(rates), statistics.mean(rates) * row_bytes,
                          max(rates) * row_bytes))
    med = statistics.median
    sparse_m, dense_m, tcp_m = med(sparse_s), med(dense_s), med(tcp_bps)
    rows_m = med(r for r, _, _ in per_round)
    bytes_m = med(b for _, b, _ in per_round)
    ratios = [d / s for d, s in zip(dense_s, sparse_s)]
    shard_vs_tcp = [b / t for (_, b, _), t in zip(per_round, tcp_bps)]
    dense_bytes = 2 * rows * row_bytes / shards  # Whole gradient in, whole table out.

    def series(values, fmt):
        return ", ".join(fmt.format(v) for v in values)

    def row(label, value, unit, values):
        return f"{label:46}{value:>13} {unit:5}  {values}"

    lines += [
        row("", "median", "", "rounds"),
        row("1. step, sparse (pull + push of touched rows)", f"{sparse_m * 1e3:.2f}", "ms",
            series([v * 1e3 for v in sparse_s], "{:.2f}")),
        row("   step, dense (whole table, ServerOptimizer)", f"{dense_m * 1e3:.0f}", "ms",
            series([v * 1e3 for v in dense_s], "{:.0f}")),
        row("   dense / sparse (target >= 20)", f"{med(ratios):.1f}", "x",
            series(ratios, "{:.1f}") + f"  (ratio of the medians {dense_m / sparse_m:.1f})"),
        row("2. sparse rows/s per shard (pulled + pushed)", f"{rows_m:,.0f}", "rows",
            series([r for r, _, _ in per_round], "{:,.0f}")),
        row("   sparse row bytes/s per shard", f"{bytes_m / 1e6:,.1f}", "MB/s",
            series([b / 1e6 for _, b, _ in per_round], "{:,.1f}")),
        row("   one TCP stream on loopback (Python)", f"{tcp_m / 1e6:,.1f}", "MB/s",
            series([t / 1e6 for t in tcp_bps], "{:,.1f}")),
        row("   per shard / TCP stream (target >= 0.5)", f"{med(shard_vs_tcp):.3f}", "",
            series(shard_vs_tcp, "{:.3f}")),
        f"# per shard and step: {touched * flags['workers'] / shards:,.0f} rows pulled and as "
        f"many pushed ({2 * touched * flags['workers'] * row_bytes / shards / 2**20:.2f} MiB of "
        f"rows, ids not counted); dense: {dense_bytes / 2**20:,.0f} MiB per shard and step "
        f"(dense bytes/s per shard, median: {dense_bytes / dense_m / 1e6:,.0f} MB/s)",
        f"# the busiest shard moved {med(b for _, _, b in per_round) / 1e6:,.1f} MB/s (median); "
        f"the shards' dptrain_ps_sparse_rows_*_total: {'; '.join(sorted(set(checks)))}",
        "# MB = 10^6 bytes, MiB = 2^20"]
    if float(load_before.split()[0]) > 1 or float(load_after.split()[0]) > 1:
        lines.append("# MEASURED UNDER LOAD (1-minute load average above 1): rerun on a quiet "
                     "machine for the figures")
    print("\n".join(lines[summary_at:]), flush=True)
    if flags["out"]:
        with open(flags["out"], "w") as f:
            f.write("\n".join(lines) + "\n")
    shutil.rmtree(_scratch, ignore_errors=True)  # Kept (logs) when a round failed.


if __name__ == "__main__":
    try:
        main()
    finally:
        _stop_all()
