#!/usr/bin/python3
"""CPU training head to head, ours against PyTorch 1.13 (Debian), in interleaved rounds so that
both sides see the same machine load (this machine is shared: figures move by 2x from minute
to minute; compare within a round, read medians).

Per model and round, back to back, each point in a fresh process:
  step alone   ours: compute_benchmark --threads=auto (gpu_worker's default plan)
               PyTorch "best": OpenMP OpenBLAS (LD_LIBRARY_PATH=OPENMP_BLAS),
                 set_num_threads(cores) (+ OMP/OPENBLAS_NUM_THREADS), and the same at 1 thread
               PyTorch "default env": nothing set (Debian's pthread OpenBLAS, PyTorch's default)
  end to end   ours: gpu_worker --mode=allreduce --world_size=1 --device=cpu, default flags
                 (--threads=auto), the last epoch's images/s (shuffled batches gathered from
                 Fashion-MNIST, evaluation excluded), peak RSS (wait4)
               PyTorch: tools/bench_torch_train.py, the same three configurations
Then 2 workers on one box (mlp, lenet): ours --mode=allreduce and --mode=ps (1 shard) through
deploy/local_cluster.sh (LOCAL_WORLD_SIZE=2, so 1 thread each), against PyTorch DDP gloo with
2 processes (OpenMP OpenBLAS, 1 thread each); the job's images/s = the sum of the ranks'.

Quiet machine: before the first point the script waits (--wait_quiet) until other processes
keep at most --max_busy of the cores busy, and samples that again before every point; the
report says whether every point was quiet, and the exit status is 3 when one was not (such
figures are no claim). Each table gives the ratio of medians and, beside it, the best round
against the best round.

usage: tools/compute_head_to_head.py --out=DIR [--rounds=3] [--resnet18_rounds=1]
         [--models=mlp,lenet,resnet18] [--two_worker_models=mlp,lenet]
(expects bazel-bin/{tests/bench/compute_benchmark,worker/gpu_worker,server/ps_server};
tools/compute_bench.sh builds them and calls this.)
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

OPENMP_BLAS = "/usr/lib/x86_64-linux-gnu/openblas-openmp"
PY = "/usr/bin/python3"
# Steps: mlp/lenet epochs cut to keep a round to minutes with PyTorch's slow configurations
# (the same cut on both sides); resnet18 (seconds per step on 2 cores) to one epoch of 3 steps
# (its first step included, on both sides).
E2E = {"mlp": ["--epochs=2"],
       "lenet": ["--epochs=2", "--max_steps_per_epoch=40"],
       "resnet18": ["--epochs=1", "--max_steps_per_epoch=3"]}
STEP = {"mlp": ["--warmup=3", "--steps=40"], "lenet": ["--warmup=3", "--steps=20"],
        "resnet18": ["--resnet18_warmup=1", "--resnet18_steps=2"]}


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def cpu_busy(seconds=0.5):
    """The fraction of all cores busy over `seconds` (/proc/stat), while this script measures
    nothing: other jobs' share of the machine."""
    def sample():
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return sum(fields), fields[3] + fields[4]  # total, idle + iowait
    t0, i0 = sample()
    time.sleep(seconds)
    t1, i1 = sample()
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def rss_of(cmd, env=None):
    """Runs cmd; returns (its output, exit code, peak RSS in MiB of it or its largest child)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    rc = os.waitstatus_to_exitcode(status)
    return out, rc, usage.ru_maxrss / 1024.0


def kv(line):
    return dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)


def results(out):
    # Split on the marker, not on lines: DDP ranks share one pipe and their lines can merge.
    return [kv("result " + chunk) for chunk in out.split("result ")[1:]]


def torch_env(config, threads):
    env = dict(os.environ)
    if config == "default":
        return env
    env["LD_LIBRARY_PATH"] = OPENMP_BLAS
    env["OMP_NUM_THREADS"] = env["OPENBLAS_NUM_THREADS"] = str(threads)
    return env


INPUT = ["--input=1x28x28"]  # One image's CxHxW for the step points (--input).


def step_ours(model):
    out, rc, _ = rss_of(["bazel-bin/tests/bench/compute_benchmark", f"--models={model}",
                         "--threads=auto"] + STEP[model] + INPUT)
    m = re.search(r"^\| %s \| auto \| [^|]+\| [^|]+\| [^|]+\| ([\d.]+) \| ([\d.]+) \|" % model,
                  out, re.M)
    if rc != 0 or not m:
        raise RuntimeError(f"compute_benchmark {model}: rc {rc}\n{out[-2000:]}")
    return float(m.group(1)), float(m.group(2))


def step_torch(model, config, threads):
    cmd = [PY, "tools/bench_torch_compute.py", f"--models={model}", f"--threads={threads}"]
    cmd += STEP[model] + INPUT
    if config == "default":
        cmd.append("--default_env")
    out, rc, _ = rss_of(cmd, env=torch_env("default", 0) if config == "default"
                        else dict(os.environ, LD_LIBRARY_PATH=OPENMP_BLAS))
    m = re.search(r"^\| %s \| (\d+) \| [^|]+\| [^|]+\| [^|]+\| ([\d.]+) \| ([\d.]+) \|" % model,
                  out, re.M)
    if rc != 0 or not m:
        raise RuntimeError(f"bench_torch_compute {model} {config}: rc {rc}\n{out[-2000:]}")
    return float(m.group(2)), float(m.group(3))


def step_variant(model, flags, threads="auto"):
    """Step alone of ours with extra compute_benchmark flags (e.g. --dense_gemm=blas: no pool and
    BLAS's threads; --conv=im2col: no oneDNN)."""
    out, rc, _ = rss_of(["bazel-bin/tests/bench/compute_benchmark", f"--models={model}",
                         f"--threads={threads}"] + flags + STEP[model])
    m = re.search(r"^\| %s \| %s \| [^|]+\| [^|]+\| [^|]+\| ([\d.]+) \|" % (model, threads),
                  out, re.M)
    if rc != 0 or not m:
        raise RuntimeError(f"compute_benchmark {model} {flags}: rc {rc}\n{out[-2000:]}")
    return float(m.group(1))


def e2e_ours(model):
    cmd = ["bazel-bin/worker/gpu_worker", "--mode=allreduce", "--world_size=1", "--device=cpu",
           f"--model={model}", "--lr=0.1", "--test_subset=256"] + E2E[model]
    out, rc, rss = rss_of(cmd)
    rates = re.findall(r"epoch (\d+)/\d+ .* images/s (\d+)", out)
    if rc != 0 or not rates:
        raise RuntimeError(f"gpu_worker {model}: rc {rc}\n{out[-2000:]}")
    plan = re.search(r"rank 0/1: (threads \d+ .*)$", out, re.M)
    return float(rates[-1][1]), rss, plan.group(1) if plan else "?"


def e2e_torch(model, config, threads, world=1, batch=256):
    cmd = [PY, "tools/bench_torch_train.py", f"--model={model}", "--lr=0.1",
           f"--world_size={world}", f"--batch_size={batch}"] + E2E[model]
    if config != "default":
        cmd.append(f"--threads={threads}")
    out, rc, rss = rss_of(cmd, env=torch_env(config, threads))
    rs = results(out)
    if rc != 0 or len(rs) != world:
        raise RuntimeError(f"bench_torch_train {model} {config} x{world}: rc {rc}\n{out[-2000:]}")
    return sum(float(r["images_per_s"]) for r in rs), max(float(r["maxrss_mib"]) for r in rs)


def two_ours(model, mode):
    logs = f"/tmp/h2h-{os.getpid()}-{mode}"
    cmd = ["deploy/local_cluster.sh", f"--mode={mode}", "--workers=2", "--shards=1", "--lr=0.1",
           f"--logs={logs}", "--", f"--model={model}", "--batch_size=128", "--test_subset=256",
           "--device=cpu"] + E2E[model]
    out, rc, rss = rss_of(cmd)
    total = 0.0
    for r in range(2):
        with open(f"{logs}/worker{r}.log") as f:
            rates = re.findall(r"epoch \d+/\d+ .* images/s (\d+)", f.read())
        total += float(rates[-1])
    if rc != 0:
        raise RuntimeError(f"local_cluster {mode} {model}: rc {rc}\n{out[-2000:]}")
    return total, rss


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--resnet18_rounds", type=int, default=1)
    p.add_argument("--models", default="mlp,lenet,resnet18")
    p.add_argument("--two_worker_models", default="mlp,lenet")
    p.add_argument("--report_only", action="store_true",
                   help="measure nothing: rebuild compute.md from OUT/raw.jsonl")
    p.add_argument("--dense_models", default="mlp,lenet",
                   help="models on which to time the pool split vs BLAS's threads and no pool")
    p.add_argument("--conv_models", default="lenet,resnet18",
                   help="models on which to time oneDNN where the rule says (auto) vs im2col only")
    p.add_argument("--input", default="1x28x28",
                   help="one image's CxHxW for the step points (3x32x32: CIFAR-shaped)")
    p.add_argument("--step_only", action="store_true",
                   help="only the step points (the end-to-end ones train on Fashion-MNIST)")
    p.add_argument("--max_busy", type=float, default=0.15,
                   help="the machine is quiet when, between points, other processes keep at "
                   "most this fraction of the cores busy (sampled for 0.5 s before each point)")
    p.add_argument("--wait_quiet", type=float, default=300,
                   help="seconds to wait for a quiet machine before the first point")
    args = p.parse_args()
    INPUT[:] = [f"--input={args.input}"]
    os.makedirs(args.out, exist_ok=True)
    cores = len(os.sched_getaffinity(0))
    raw = open(os.path.join(args.out, "raw.jsonl"), "a")  # Closed unused with --report_only.
    data = {}  # (section, model, config) -> list of (images/s, rss)
    loads = []
    busy = []  # Other jobs' share of the cores before each point.

    def record(section, model, config, value, rss, extra=None):
        data.setdefault((section, model, config), []).append((value, rss))
        row = {"section": section, "model": model, "config": config, "images_per_s": value,
               "maxrss_mib": rss, "loadavg": loadavg(), "time": time.strftime("%H:%M:%S"),
               "busy_before": busy[-1] if busy else None}
        if extra:
            row.update(extra)
        raw.write(json.dumps(row) + "\n")
        raw.flush()
        print(f"  {section:5s} {model:8s} {config:14s} {value:10.1f} images/s  {rss:7.1f} MiB  "
              f"load {row['loadavg']}", file=sys.stderr, flush=True)

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    plan = "?"
    models = [m for m in args.models.split(",") if m]
    if args.report_only:
        raw.close()
        rows = [json.loads(l) for l in open(os.path.join(args.out, "raw.jsonl"))]
        for r in rows:
            data.setdefault((r["section"], r["model"], r["config"]), []).append(
                (r["images_per_s"], r["maxrss_mib"]))
            if r.get("busy_before") is not None:
                busy.append(r["busy_before"])
            plan = r.get("plan", plan)
        started = f"{rows[0]['time']}–{rows[-1]['time']} UTC" if rows else "?"
        loads = [f"{rows[0]['loadavg']} (first point)", f"{rows[-1]['loadavg']} (last)"] if rows else []
        args.rounds = max(len(v) for k, v in data.items() if k[1] != "resnet18")
    if not args.report_only:
        waited = 0.0
        while cpu_busy(1.0) > args.max_busy and waited < args.wait_quiet:
            waited += 1.0
        print(f"machine quiet after {waited:.0f} s" if waited < args.wait_quiet else
              f"machine still busy after {waited:.0f} s: measuring anyway, the report says so",
              file=sys.stderr, flush=True)

    def quiet():
        busy.append(cpu_busy())

    for rnd in range(1, 0 if args.report_only else args.rounds + 1):
        loads.append(loadavg())
        for model in models:
            if model == "resnet18" and rnd > args.resnet18_rounds:
                continue
            print(f"== round {rnd}/{args.rounds}: {model} (load {loadavg()})", file=sys.stderr)
            quiet()
            v, rss = step_ours(model)
            record("step", model, "ours", v, rss)
            for config, t in [("best", cores), ("best_1thread", 1), ("default", 0)]:
                if config == "best_1thread" and model == "resnet18":
                    continue
                quiet()
                v, rss = step_torch(model, config, t)
                record("step", model, config, v, rss)
            if args.step_only:
                continue
            quiet()
            v, rss, plan = e2e_ours(model)
            record("e2e", model, "ours", v, rss, {"plan": plan})
            for config, t in [("best", cores), ("best_1thread", 1), ("default", 0)]:
                if config == "best_1thread" and model == "resnet18":
                    continue
                quiet()
                v, rss = e2e_torch(model, config, t)
                record("e2e", model, config, v, rss)
        if cores > 1:
            for model in [m for m in args.dense_models.split(",") if m]:
                for dense in ["split", "blas"]:
                    quiet()
                    record("dense", model, dense, step_variant(model, [f"--dense_gemm={dense}"]), 0)
        for model in [m for m in args.conv_models.split(",") if m]:
            if model == "resnet18" and rnd > args.resnet18_rounds:
                continue
            for threads in ["auto", "1"]:
                for conv in ["auto", "im2col"]:
                    quiet()
                    record("conv", model, f"{conv}_{threads}",
                           step_variant(model, [f"--conv={conv}"], threads), 0)
        for model in [m for m in args.two_worker_models.split(",") if m]:
            print(f"== round {rnd}/{args.rounds}: 2 workers, {model}", file=sys.stderr)
            for mode in ["allreduce", "ps"]:
                quiet()
                v, rss = two_ours(model, mode)
                record("two", model, f"ours_{mode}", v, rss)
            quiet()
            v, rss = e2e_torch(model, "best", 1, world=2, batch=128)
            record("two", model, "ddp_gloo", v, rss)
    if not args.report_only:
        loads.append(loadavg())

    def cell(section, model, config):
        xs = [v for v, _ in data.get((section, model, config), [])]
        if not xs:
            return "–", float("nan")
        m = median(xs)
        rng = f" ({min(xs):.0f}–{max(xs):.0f})" if len(xs) > 1 else ""
        return f"{m:,.0f}{rng}", m

    def top(section, model, config):
        xs = [v for v, _ in data.get((section, model, config), [])]
        return max(xs) if xs else float("nan")

    def peak(section, model, config):
        xs = [r for _, r in data.get((section, model, config), [])]
        return f"{max(xs):.0f}" if xs else "–"

    resnet_rounds = len(data.get(("step", "resnet18", "ours"), []))
    load_note = ("at the first and the last point (every point's in raw.jsonl)" if args.report_only
                 else "at the start of each round and at the end")
    noisy = [b for b in busy if b > args.max_busy]
    quiet_line = (f"Quiet: before every point other processes kept at most "
                  f"{100 * max(busy, default=0):.0f} % of the cores busy (limit "
                  f"{100 * args.max_busy:.0f} %)." if not noisy else
                  f"**NOT QUIET: before {len(noisy)} of {len(busy)} points other processes kept "
                  f"up to {100 * max(noisy):.0f} % of the cores busy (limit "
                  f"{100 * args.max_busy:.0f} %): these figures are no claim; rerun on a quiet "
                  f"machine.**")
    lines = [f"# CPU training head to head: ours vs PyTorch {torch_version()}"
             + (f", {args.input} images" if args.input != "1x28x28" else ""), "", quiet_line, "",
             f"Measured {started} on {cores} cores, {args.rounds} interleaved round(s) "
             f"(resnet18: {resnet_rounds}); load average (1, 5, 15 min) {load_note}: "
             f"{' | '.join(loads)}. "
             f"Ours at default flags: {plan}. images/s: median of the rounds (lowest–highest). "
             "PyTorch best = OpenMP OpenBLAS with set_num_threads(cores); 1 thread = the same "
             "at set_num_threads(1); default env = nothing set. Ratio = ours / the fastest of "
             "PyTorch's three configurations (medians).", ""]
    for section, title in [("e2e", "End to end (one worker, the last epoch's training images/s)"),
                           ("step", "Step alone (forward, loss, backward, SGD; fixed batch)")]:
        if not any(k[0] == section for k in data):
            continue
        lines += [f"## {title}", "",
                  "| model | ours | PyTorch best | PyTorch 1 thread | PyTorch default env | "
                  "ours / fastest PyTorch (medians) | best round vs best round | "
                  "peak MiB ours / PyTorch best |",
                  "|---|---|---|---|---|---|---|---|"]
        for model in models:
            o, om = cell(section, model, "ours")
            b, bm = cell(section, model, "best")
            b1, b1m = cell(section, model, "best_1thread")
            d, _ = cell(section, model, "default")
            d_m = cell(section, model, "default")[1]
            tuned = [x for x in [bm, b1m, d_m] if x == x]
            best = max(tuned) if tuned else float("nan")
            tops = [top(section, model, c) for c in ["best", "best_1thread", "default"]]
            tops = [x for x in tops if x == x]
            top_ratio = top(section, model, "ours") / max(tops) if tops else float("nan")
            lines.append(f"| {model} | {o} | {b} | {b1} | {d} | **{om / best:.2f}** | "
                         f"{top_ratio:.2f} | "
                         f"{peak(section, model, 'ours')} / {peak(section, model, 'best')} |")
        lines.append("")
    two = [m for m in args.two_worker_models.split(",") if m]
    if two:
        lines += ["## 2 workers on one box (job images/s = sum of the 2 ranks', 128 per rank)", "",
                  "| model | ours allreduce | ours ps (1 shard) | PyTorch DDP gloo | "
                  "allreduce / DDP | ps / DDP |", "|---|---|---|---|---|---|"]
        for model in two:
            a, am = cell("two", model, "ours_allreduce")
            s, sm = cell("two", model, "ours_ps")
            g, gm = cell("two", model, "ddp_gloo")
            lines.append(f"| {model} | {a} | {s} | {g} | **{am / gm:.2f}** | **{sm / gm:.2f}** |")
        lines.append("")
    dense = [m for m in args.dense_models.split(",") if m and ("dense", m, "split") in data]
    if dense:
        lines += ["## Thread plan: layers split over the pool, or BLAS's threads and no pool", "",
                  "Step alone, --threads=auto (compute_benchmark --dense_gemm=split|blas): "
                  "every layer splits its batch over the model's pool (BLAS at 1 thread), or "
                  "there is no pool and every GEMM runs on BLAS's threads.", "",
                  "| model | split over the pool | BLAS threads | split / BLAS |", "|---|---|---|---|"]
        for model in dense:
            a, am = cell("dense", model, "split")
            b, bm = cell("dense", model, "blas")
            lines.append(f"| {model} | {a} | {b} | {am / bm:.2f} |")
        lines.append("")
    conv = [m for m in args.conv_models.split(",") if m and ("conv", m, "auto_auto") in data]
    if conv:
        lines += ["## Convolutions: oneDNN where the measured rule says, or im2col + OpenBLAS only",
                  "", "Step alone (compute_benchmark --conv=auto|im2col), images/s: auto runs "
                  "the layers PreferOneDnn picks (worker/nn/onednn_conv.h) on oneDNN.", "",
                  "| model | threads | auto (oneDNN where picked) | im2col only | auto / im2col |",
                  "|---|---|---|---|---|"]
        for model in conv:
            for threads in ["auto", "1"]:
                a, am = cell("conv", model, f"auto_{threads}")
                b, bm = cell("conv", model, f"im2col_{threads}")
                lines.append(f"| {model} | {threads} | {a} | {b} | **{am / bm:.2f}** |")
        lines.append("")
    lines.append("Raw points (with the load average at each): raw.jsonl.")
    report = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "compute.md"), "w") as f:
        f.write(report)
    print(report)
    if noisy:
        print(f"compute_head_to_head: the machine was not quiet ({len(noisy)} of {len(busy)} "
              "points): the report says so; exit status 3", file=sys.stderr)
        return 3
    return 0


def torch_version():
    try:
        return subprocess.run([PY, "-c", "import torch; print(torch.__version__)"],
                              capture_output=True, text=True).stdout.strip() or "?"
    except OSError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
