#!/usr/bin/env python3
"""dptrain.torch on a CUDA GPU (issue 26, "Mixed precision and devices"), in one call of about
--budget seconds; run from the repository root of a built checkout or of the GPU bundle:

  a. correctness: tests/torch/worker.py --cuda, 2 ranks sharing the GPU, in allreduce, master
     and ps (2 ps_server shards, --optimizer=none) mode: both ranks' final weights identical
     and within 1e-5 (relative) of one process training on the global batch on the GPU;
  b. global skip under fp16 autocast + GradScaler (worker.py --cuda --amp --inf_at=2:1): rank
     1 overflows at step 2, both ranks skip it and halve the scale (1024 -> 512), as the
     reference (which overflows at that step) does; allreduce and ps mode;
  c. a real `torchrun --nproc_per_node=2` launch (allreduce, --cuda) against the reference;
  d. figures: the d2l ResNet-18 (tools/gpu/torch_resnet.py) on 1x28x28 batches of 256
     (Fashion-MNIST's first images when --data has them), fp32 (TF32 off): one worker's
     images/s (median step, CUDA synchronised around each) in the plain PyTorch loop and
     through each mode, at world size 1 and with 2 ranks sharing the GPU.
  e. dpt.SyncBatchNorm on the GPU (worker.py --cuda --sync_bn): 2 ranks on half batches,
     allreduce mode, within 1e-5 of one process whose BatchNorm2d sees the whole batch.
a, b, c and e run concurrently (small models), d alone afterwards. Every step runs under a time
limit cut to what is left of the budget; a step with no time left is reported as not run.
Prints one Markdown table (also OUT/torch_gpu_check.md), writes OUT/torch_gpu_check.json and
the logs as OUT/torch_gpu_check.logs.tar.gz; exits 1 if a check of a-c or e failed or did not run.

--dry: the same plumbing on this machine's CPU (no --cuda, no autocast, a small batch), for
checking the script where there is no GPU.

usage: torch_gpu_check.py --bin=DIR [--lib=DIR] [--data=DIR] [--out=DIR] [--budget=150]
                          [--dry] [--only=a,b,c,d,e] [--steps=30] [--warmup=5]
  --bin: ps_server (DIR/ps_server or a bazel-bin's DIR/server/ps_server) and, unless
         DPTRAIN_NATIVE_LIB names it, libdptrain_c.so (in DIR, --lib, DIR/../lib or
         DIR/python/native); --lib (default DIR/../lib when it exists) joins LD_LIBRARY_PATH.
"""
import argparse
import concurrent.futures
import contextlib
import gzip
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
WORKER = os.path.join(REPO, "tests", "torch", "worker.py")
for path in (os.path.join(REPO, "python"), os.path.join(REPO, "tests"),
             os.path.join(REPO, "tools", "gpu")):
    if path not in sys.path:
        sys.path.insert(0, path)

BATCH = 256
# The figures' order (the first the most useful). *_after: DPTRAIN_OVERLAP=0, the push starts
# when backward has ended (what pushing while backward runs gains).
MODES = ("plain", "allreduce", "ps", "master", "ps_after", "master_after")


class CheckFailed(Exception):
    pass


def _arguments(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default=os.path.join(REPO, "bazel-bin"))
    p.add_argument("--lib", default="")
    p.add_argument("--data", default="")
    p.add_argument("--out", default="torch_gpu_check.out")
    p.add_argument("--budget", type=float, default=150.0)
    p.add_argument("--dry", action="store_true")
    p.add_argument("--only", default="a,b,c,d,e")
    p.add_argument("--steps", type=int, default=0, help="timed steps (default 30; --dry 3)")
    p.add_argument("--warmup", type=int, default=-1, help="warm-up steps (default 5; --dry 1)")
    p.add_argument("--batch", type=int, default=0, help="per worker (default 256; --dry 8)")
    # The figures' worker (started by this script).
    p.add_argument("--bench_worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--ports", default="", help=argparse.SUPPRESS)
    p.add_argument("--ps", default="", help=argparse.SUPPRESS)
    p.add_argument("--ps_after", default="", help=argparse.SUPPRESS)
    p.add_argument("--barrier", default="", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.steps = a.steps or (3 if a.dry else 30)
    a.warmup = a.warmup if a.warmup >= 0 else (1 if a.dry else 5)
    a.batch = a.batch or (8 if a.dry else BATCH)
    return a


# ---- The figures' worker: one process, every mode in turn (init, time, shutdown).

def _barrier(directory, tag, rank, world, timeout=120):
    """Every rank reaches `tag` (files in `directory`) before any goes on."""
    open(os.path.join(directory, f"{tag}.{rank}"), "w").close()
    deadline = time.time() + timeout
    while not all(os.path.exists(os.path.join(directory, f"{tag}.{r}")) for r in range(world)):
        if time.time() > deadline:
            raise RuntimeError(f"barrier {tag}: the other ranks never came")
        time.sleep(0.01)


def _batch(data_dir, n, device):
    import torch
    images = os.path.join(data_dir, "train-images-idx3-ubyte.gz") if data_dir else ""
    if images and os.path.exists(images):
        with gzip.open(images, "rb") as f:
            raw = f.read(16 + n * 784)[16:]
        with gzip.open(images.replace("images-idx3", "labels-idx1"), "rb") as f:
            labels = f.read(8 + n)[8:]
        x = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(n, 1, 28, 28)
        y = torch.frombuffer(bytearray(labels), dtype=torch.uint8).long()
        return x.to(device).float().div_(255), y.to(device), "Fashion-MNIST"
    g = torch.Generator().manual_seed(0)
    return (torch.randn(n, 1, 28, 28, generator=g).to(device),
            torch.randint(0, 10, (n,), generator=g).to(device), "synthetic")


def bench_worker(a):
    import torch
    from torch import nn
    from torch_resnet import resnet18
    cuda = not a.dry
    device = torch.device("cuda", a.rank % torch.cuda.device_count()) if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_num_threads(1 if a.dry else 4)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    x, y, source = _batch(a.data, a.batch, device)
    ports = dict(kv.split(":") for kv in a.ports.split(",") if kv)
    loss_fn = nn.CrossEntropyLoss()
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    for mode in MODES:
        _barrier(a.barrier, mode, a.rank, a.world)
        record = {"mode": mode, "rank": a.rank, "world": a.world, "device": name,
                  "data": source, "batch": a.batch}
        dpt = None
        try:
            torch.manual_seed(0)
            net = resnet18().to(device)
            opt = torch.optim.SGD(net.parameters(), lr=0.1)
            if mode != "plain":
                import dptrain.torch as dpt
                os.environ["DPTRAIN_OVERLAP"] = "0" if mode.endswith("_after") else "1"
                shards = {"ps": a.ps, "ps_after": a.ps_after}.get(mode, "")
                dpt.init(mode=mode.replace("_after", ""), rank=a.rank, size=a.world,
                         local_rank=a.rank, local_size=a.world, ps=shards,
                         master_addr="127.0.0.1", master_port=int(ports[mode]),
                         timeout=30)
                opt = dpt.DistributedOptimizer(opt, named_parameters=net.named_parameters())
                dpt.broadcast_parameters(net.state_dict(), root_rank=0)

            def step():
                opt.zero_grad(set_to_none=True)
                loss_fn(net(x), y).backward()
                opt.step()

            for _ in range(a.warmup):
                step()
            times = []
            for _ in range(a.steps):
                sync()
                start = time.perf_counter()
                step()
                sync()
                times.append(time.perf_counter() - start)
            median = statistics.median(times)
            record.update(median_s=median, images_per_s=a.batch / median)
        except Exception as e:  # One mode's failure is reported; the others still run.
            record["error"] = f"{type(e).__name__}: {e}"[:300]
        finally:
            if dpt is not None and dpt.is_initialized():
                with contextlib.suppress(Exception):
                    dpt.shutdown()
        print("BENCH " + json.dumps(record), flush=True)
    return 0


# ---- The driver.

class Driver:
    def __init__(self, a):
        self.a = a
        self.start = time.time()
        self.deadline = self.start + a.budget - 3  # Room for the table and the logs.
        self.out = os.path.abspath(a.out)
        self.logs = os.path.join(self.out, "torch_gpu_check.logs")
        os.makedirs(self.logs, exist_ok=True)
        self.rows = []  # (section, check, status, detail)
        self.bench = []
        self.own = []  # Popen objects started here outside the test helpers (process groups).
        self.info = {}

    # -- Environment and helpers.

    def setup(self):
        a = self.a
        bin_dir = os.path.abspath(a.bin)
        lib_dir = a.lib or (os.path.join(bin_dir, "..", "lib")
                            if os.path.isdir(os.path.join(bin_dir, "..", "lib")) else "")
        self.ps_server = next((p for p in (os.path.join(bin_dir, "ps_server"),
                                           os.path.join(bin_dir, "server", "ps_server"))
                               if os.path.exists(p)), None)
        native = os.environ.get("DPTRAIN_NATIVE_LIB") or next(
            (p for p in (os.path.join(d, "libdptrain_c.so") for d in
                         (bin_dir, lib_dir, os.path.join(bin_dir, "python", "native")) if d)
             if os.path.exists(p)), None)
        env = os.environ
        env["PYTHONPATH"] = os.pathsep.join(
            [os.path.join(REPO, "python")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        if lib_dir:
            env["LD_LIBRARY_PATH"] = os.pathsep.join(
                [os.path.abspath(lib_dir)] + ([env["LD_LIBRARY_PATH"]]
                                              if env.get("LD_LIBRARY_PATH") else []))
        if native:
            env["DPTRAIN_NATIVE_LIB"] = os.path.abspath(native)
        env["PYTHONUNBUFFERED"] = "1"
        env.setdefault("DPTRAIN_TIMEOUT", "30")
        for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT",
                    "TORCHELASTIC_RUN_ID", "DPTRAIN_PS", "DPTRAIN_MODE", "DPTRAIN_PORT"):
            env.pop(var, None)
        missing = [what for what, p in (("ps_server", self.ps_server),
                                        ("libdptrain_c.so", native)) if p is None]
        # The CPU suite's helpers (tests/torch_workers_test.py), pointed at these paths; their
        # failures raise here instead of ending the process.
        import torch_workers_test as twt
        twt.PS_SERVER = self.ps_server or "ps_server"
        twt.SCRATCH = self.logs
        twt.PYTHON = sys.executable

        def fail(message):
            raise CheckFailed(message)
        twt.fail = fail
        self.twt = twt
        import torch
        self.cuda = torch.cuda.is_available() and not a.dry
        self.info = {"torch": torch.__version__, "python": sys.version.split()[0],
                     "cuda_available": torch.cuda.is_available(), "dry": a.dry,
                     "native_lib": native, "ps_server": self.ps_server}
        if self.cuda:
            self.info["device"] = torch.cuda.get_device_name(0)
        return missing

    def left(self):
        return self.deadline - time.time()

    def limit(self, want):
        """A step's time limit: `want` seconds, or what is left; None when under 8 s."""
        left = self.left()
        return None if left < 8 else min(want, left)

    def row(self, section, check, status, detail):
        self.rows.append((section, check, status, detail))
        print(f"[{time.time() - self.start:5.1f}s] {section} {check}: {status} {detail}",
              flush=True)

    def popen(self, argv, log, **kw):
        p = subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                             start_new_session=True, **kw)
        self.own.append(p)
        return p

    def wait(self, procs, timeout):
        """Exit codes, or None for those still running at the deadline (then killed)."""
        deadline = time.time() + timeout
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(0.1, deadline - time.time())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        for p, c in zip(procs, codes):
            if c is None:
                self.kill(p)
        return codes

    @staticmethod
    def kill(p):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            p.kill()
            p.wait(timeout=5)

    def cleanup(self):
        for p in self.own + list(self.twt._processes if hasattr(self, "twt") else []):
            if p.poll() is None:
                self.kill(p)

    def flags(self, *extra):
        return (["--cuda"] if self.cuda else []) + list(extra)

    def reference(self, name, flags, timeout):
        out = os.path.join(self.logs, f"{name}.reference.pt")
        log = os.path.join(self.logs, f"{name}.reference.log")
        code = self.wait([self.popen([sys.executable, WORKER, out, "--reference", *flags],
                                     log)], timeout)[0]
        if code != 0:
            raise CheckFailed(f"the reference ({name}): "
                              + ("ran past its time limit" if code is None else f"exit {code}")
                              + ": " + open(log).read()[-400:])
        return out

    @staticmethod
    def compare(outs, ref):
        import torch
        states = [torch.load(o, map_location="cpu") for o in outs]
        want = torch.load(ref, map_location="cpu")
        for r, s in enumerate(states):
            for key in want:
                if not torch.equal(s[key], states[0][key]):
                    raise CheckFailed(f"rank {r}'s {key} differs from rank 0's")
        return max(((states[0][k] - want[k]).abs().max() / (want[k].abs().max() or 1.0)).item()
                    for k in want)

    # -- a, b, c: correctness (concurrent).

    def correctness(self):
        only = self.a.only.split(",")
        timeout = lambda want: self.limit(want) or 1  # noqa: E731
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=10)  # Every task at once.
        if "a" in only or "c" in only:
            ref_sgd = pool.submit(self.reference, "sgd", self.flags(), timeout(60))
        if "b" in only:
            amp = ["--amp"] if self.cuda else []
            ref_skip = pool.submit(self.reference, "skip", self.flags(*amp, "--inf_at=2:1"),
                                   timeout(60))
        device = "cuda" if self.cuda else "cpu (--dry)"
        cases = []
        if "a" in only:
            for mode in ("allreduce", "master", "ps"):
                what = (f"{mode}, 2 ranks on {device}"
                        + (", 2 shards --optimizer=none" if mode == "ps" else "")
                        + ", SGD momentum, vs 1 process on the global batch")
                cases.append(("a", what, pool.submit(self.case_mode, mode, ref_sgd)))
        if "b" in only:
            for mode in ("allreduce", "ps"):
                what = (f"{'fp16 autocast + GradScaler' if self.cuda else 'no autocast (--dry)'}"
                        f", {mode}, rank 1 overflows at step 2")
                cases.append(("b", what, pool.submit(self.case_skip, mode, ref_skip)))
        if "c" in only:
            cases.append(("c", f"torchrun --nproc_per_node=2, allreduce, {device}",
                          pool.submit(self.case_torchrun, ref_sgd)))
        if "e" in only:
            ref_bn = pool.submit(self.reference, "sync_bn", self.flags("--sync_bn"), timeout(60))
            cases.append(("e", f"SyncBatchNorm, allreduce, 2 ranks on {device}, vs BatchNorm2d "
                          "on the global batch", pool.submit(self.case_sync_bn, ref_bn)))
        for section, what, future in cases:
            try:
                detail = future.result(timeout=max(1, self.left()))
                self.row(section, what, "ok", detail)
            except concurrent.futures.TimeoutError:
                self.row(section, what, "not run", "out of time" + (
                    " (started; its processes are killed)" if future.running() else ""))
            except CheckFailed as e:
                self.row(section, what, "FAIL", str(e)[-600:])
            except Exception as e:  # noqa: BLE001 - reported, never raised
                self.row(section, what, "FAIL", f"{type(e).__name__}: {e}"[-600:])
        # What a failed or timed-out case left running (its workers, its shards) goes now.
        for p in list(self.twt._processes):
            if p.poll() is None:
                self.kill(p)
        pool.shutdown(wait=False)

    def shards(self, n, workers):
        return ",".join(self.twt.start_shards(n, workers, "--optimizer=none"))

    def case_mode(self, mode, ref_future):
        env = {"DPTRAIN_PS": self.shards(2, 2)} if mode == "ps" else {}
        outs, _, _ = self.twt.run_workers(f"a_{mode}", mode, self.flags(), env=env,
                                          timeout=self.limit(60) or 1)
        return self.near_reference(outs, ref_future)

    def case_sync_bn(self, ref_future):
        outs, _, _ = self.twt.run_workers("e_sync_bn", "allreduce", self.flags("--sync_bn"),
                                          timeout=self.limit(60) or 1)
        return self.near_reference(outs, ref_future)

    def near_reference(self, outs, ref_future):
        """The ranks' weights (identical, compare checks) within 1e-5 of the reference's."""
        worst = self.compare(outs, ref_future.result(timeout=max(1, self.left())))
        if worst > 1e-5:
            raise CheckFailed(f"ranks identical, but {worst:.1e} (relative) from the "
                              "reference (> 1e-5)")
        return f"ranks identical, {worst:.1e} from the reference (<= 1e-5)"

    def case_skip(self, mode, ref_future):
        env = {"DPTRAIN_PS": self.shards(1, 2)} if mode == "ps" else {}
        amp = ["--amp"] if self.cuda else []
        outs, _, _ = self.twt.run_workers(f"b_{mode}", mode, self.flags(*amp, "--inf_at=2:1"),
                                          env=env, timeout=self.limit(60) or 1)
        ref = ref_future.result(timeout=max(1, self.left()))
        got = [self.twt.summary(o) for o in outs]
        want = self.twt.summary(ref)
        if [g["skipped"] for g in got] != [1, 1]:
            raise CheckFailed(f"skipped steps per rank {[g['skipped'] for g in got]} (want "
                              f"[1, 1]); reference {want['skipped']}")
        scales = [g.get("scale") for g in got]
        if self.cuda and not scales[0] == scales[1] == want.get("scale") == 512.0:
            raise CheckFailed(f"GradScaler's scale per rank {scales}, reference "
                              f"{want.get('scale')} (want 512: 1024 halved once)")
        worst = self.compare(outs, ref)
        # fp16 GEMMs and convolutions of 8-image and 16-image batches round differently.
        tolerance = 1e-3 if self.cuda else 1e-5
        if worst > tolerance:
            raise CheckFailed(f"both skipped, ranks identical, but {worst:.1e} from the "
                              f"reference (> {tolerance:g})")
        scale = "scale 1024 -> 512 on both ranks and the reference, " if self.cuda else ""
        return (f"both ranks skipped step 2 only, {scale}ranks identical, {worst:.1e} from "
                f"the reference that skips it (<= {tolerance:g})")

    def case_torchrun(self, ref_future):
        port = self.twt.free_port()  # torchrun's store; dptrain meets on the next port.
        out = os.path.join(self.logs, "c_torchrun.rank{rank}.pt")
        log = os.path.join(self.logs, "c_torchrun.log")
        env = dict(os.environ, DPTRAIN_MODE="allreduce")
        # --redirects=1 --tee=2: the workers' stdout into --log_dir, their stderr there and
        # in the log. (The defaults, 0, are None for torch 1.13's torchrun under Python 3.11,
        # whose IntFlag iteration skips zero: its torchrun fails at once.)
        p = self.popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                        "--nnodes=1", "--master_addr=127.0.0.1", f"--master_port={port}",
                        "--redirects=1", "--tee=2", f"--log_dir={log[:-4]}", WORKER, out,
                        *self.flags()], log, env=env)
        code = self.wait([p], self.limit(60) or 1)[0]
        if code != 0:
            text = open(log).read()
            raise CheckFailed(("ran past its time limit" if code is None else f"exit {code}")
                              + ": " + text[-500:])
        outs = [out.replace("{rank}", str(r)) for r in range(2)]
        worst = self.compare(outs, ref_future.result(timeout=max(1, self.left())))
        if worst > 1e-5:
            raise CheckFailed(f"ranks identical, {worst:.1e} from the reference (> 1e-5)")
        return (f"ranks identical, {worst:.1e} from the reference (<= 1e-5); "
                "TORCHELASTIC_RUN_ID set, dptrain on MASTER_PORT + 1")

    # -- d: figures (alone on the GPU).

    def figures(self):
        for world, want in ((1, 40), (2, 70)):
            limit = self.limit(want)
            if limit is None:
                self.row("d", f"ResNet-18 figures, world size {world}", "not run", "out of time")
                continue
            procs, logs = [], []
            try:
                shard_list = self.shards(2, world)
                after_list = self.shards(2, world)  # A job of its own: fresh shards.
            except CheckFailed as e:
                shard_list = after_list = ""
                self.row("d", f"ps shards for world size {world}", "FAIL", str(e)[-300:])
            ports = ",".join(f"{m}:{self.twt.free_port()}" for m in MODES[1:])
            barrier = os.path.join(self.logs, f"d_barrier_w{world}")
            os.makedirs(barrier, exist_ok=True)
            for r in range(world):
                log = os.path.join(self.logs, f"d_w{world}_rank{r}.log")
                logs.append(log)
                procs.append(self.popen(
                    [sys.executable, os.path.abspath(__file__), "--bench_worker", f"--rank={r}",
                     f"--world={world}", f"--ports={ports}", f"--ps={shard_list}",
                     f"--ps_after={after_list}",
                     f"--barrier={barrier}", f"--data={self.a.data}", f"--steps={self.a.steps}",
                     f"--warmup={self.a.warmup}", f"--batch={self.a.batch}"]
                    + (["--dry"] if self.a.dry else []), log))
            codes = self.wait(procs, limit)
            for p in list(self.twt._processes):  # The shards.
                if p.poll() is None:
                    self.kill(p)
            got = []
            for log in logs:
                got += [json.loads(l[6:]) for l in open(log) if l.startswith("BENCH ")]
            self.bench += got
            errors = [f"{g['mode']} rank {g['rank']}: {g['error']}" for g in got if "error" in g]
            done = {g["mode"] for g in got if "images_per_s" in g and
                    sum(h["mode"] == g["mode"] and "images_per_s" in h for h in got) == world}
            status = "ok" if len(done) == len(MODES) and not errors else "FAIL"
            measured = ", ".join(m for m in MODES if m in done) or "none"
            detail = (f"exit codes {codes}; modes measured: {measured}"
                      + (f"; errors: {'; '.join(errors)}" if errors else "")
                      + ("" if all(c == 0 for c in codes) else
                         f"; log tail: {open(logs[0]).read()[-300:]}"))
            self.row("d", f"ResNet-18 figures, world size {world}", status, detail)

    # -- The report.

    def report(self):
        a = self.a
        lines = []
        device = self.info.get("device") or ("cpu (--dry)" if a.dry else "no CUDA device")
        lines.append(f"dptrain.torch on {device}: PyTorch {self.info.get('torch')}, Python "
                     f"{self.info.get('python')}, {time.time() - self.start:.0f} s of a "
                     f"{a.budget:.0f} s budget")
        lines += ["", "| | check | result |", "|---|---|---|"]
        for section, check, status, detail in self.rows:
            lines.append(f"| {section} | {check} | {status}: {detail.replace('|', '/')} |"
                         .replace("\n", " "))
        if self.bench:
            data = next((b["data"] for b in self.bench), "?")
            lines += ["", f"d2l ResNet-18 (1x28x28, {data}), batch {a.batch} per worker, fp32 "
                      f"(TF32 off), SGD; images/s of one worker: batch / median step ({a.steps} "
                      f"timed after {a.warmup} warm-up, synchronised); 2 ranks share the GPU "
                      "(plain: 2 independent processes).", "",
                      "| mode | world 1 | vs plain | 2 ranks, per worker | vs plain |",
                      "|---|---|---|---|---|"]

            def speed(mode, world):
                v = [b["images_per_s"] for b in self.bench
                     if b["mode"] == mode and b["world"] == world and "images_per_s" in b]
                return statistics.mean(v) if len(v) == world else None

            names = {"plain": "plain PyTorch loop", "allreduce": "dptrain allreduce",
                     "ps": "dptrain ps (2 shards, --optimizer=none)", "master": "dptrain master",
                     "ps_after": "dptrain ps, push after backward (DPTRAIN_OVERLAP=0)",
                     "master_after": "dptrain master, push after backward (DPTRAIN_OVERLAP=0)"}
            for mode in MODES:
                cells = []
                for world in (1, 2):
                    s, base = speed(mode, world), speed("plain", world)
                    cells += [f"{s:.0f}" if s else "not run",
                              f"{s / base:.2f}" if s and base else "-"]
                lines.append(f"| {names[mode]} | " + " | ".join(cells) + " |")
        text = "\n".join(lines) + "\n"
        with open(os.path.join(self.out, "torch_gpu_check.md"), "w") as f:
            f.write(text)
        ok = all(status == "ok" for section, _, status, _ in self.rows if section != "d")
        with open(os.path.join(self.out, "torch_gpu_check.json"), "w") as f:
            json.dump({"ok": ok, "info": self.info, "budget_s": a.budget,
                       "wall_s": time.time() - self.start,
                       "checks": [dict(zip(("section", "check", "status", "detail"), r))
                                  for r in self.rows],
                       "bench": self.bench}, f, indent=1)
        with tarfile.open(os.path.join(self.out, "torch_gpu_check.logs.tar.gz"), "w:gz") as t:
            t.add(self.logs, arcname="torch_gpu_check.logs")
        shutil.rmtree(self.logs, ignore_errors=True)  # OUT keeps 3 files.
        print("\n" + text, flush=True)
        return ok


def main(argv):
    a = _arguments(argv)
    if a.bench_worker:
        return bench_worker(a)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # Cleans up, as on exit.
    driver = Driver(a)
    ok = False
    try:
        missing = driver.setup()
        if missing:
            driver.row("-", "setup", "FAIL", f"not found: {', '.join(missing)} (--bin, --lib, "
                       "DPTRAIN_NATIVE_LIB)")
        elif not driver.cuda and not a.dry:
            driver.row("-", "setup", "FAIL", "no CUDA device (torch.cuda.is_available() is "
                       "False); --dry runs the plumbing on the CPU")
        else:
            if set("abce") & set(a.only.split(",")):
                driver.correctness()
            if "d" in a.only.split(","):
                driver.figures()
    finally:
        driver.cleanup()
        try:
            ok = driver.report()
        except Exception:  # noqa: BLE001 - the rows printed as they came are the report
            import traceback
            traceback.print_exc()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
