"""dptrain.torch end to end, with the real ps_server and real PyTorch scripts (Debian's
python3-torch on the CPU): tests/torch/worker.py trains a small CNN in 2 processes through
each mode and is compared with the same script run as one process on the global batch.

Run by tests/torch_workers_test.sh (which finds the binaries and the library); every case
prints one line, and the first failure ends the run with a non-zero exit."""

import glob
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import torch

import dptrain.torch as dpt

HERE = os.path.dirname(os.path.abspath(__file__))
# The built binaries (bazel-bin, or the test's runfiles); scripts beside this file.
ROOT = os.environ.get("DPTRAIN_ROOT", os.path.join(HERE, "..", "bazel-bin"))
PS_SERVER = os.path.join(ROOT, "server", "ps_server")
PS_STATUS = os.path.join(ROOT, "server", "ps_status")
GPU_WORKER = os.path.join(ROOT, "worker", "gpu_worker")
WORKER = os.path.join(HERE, "torch", "worker.py")
SPARSE_WORKER = os.path.join(HERE, "torch", "sparse_worker.py")
HOROVOD_API = os.path.join(HERE, "torch", "horovod_api.py")
OPTIMIZER_EDGES = os.path.join(HERE, "torch", "optimizer_edges.py")
MAKE_CERTS = os.path.join(HERE, "..", "tools", "make_certs.sh")
LAUNCHER = os.path.join(HERE, "..", "deploy", "local_cluster.sh")
EXAMPLE = os.path.join(HERE, "..", "examples", "torch", "train_fashion_mnist.py")
CLICK_EXAMPLE = os.path.join(HERE, "..", "examples", "torch", "train_click_model.py")
SCRATCH = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp()
PYTHON = sys.executable
_processes = []


def fail(message):
    print(f"FAIL: {message}", flush=True)
    for p in _processes:
        p.kill()
    sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_shard(s, n, workers, flags, port=0):
    """Shard s of n on `port` (0: a free one); returns (process, "127.0.0.1:port")."""
    port_file = os.path.join(SCRATCH, f"shard{s}.{time.time_ns()}.port")
    log = open(os.path.join(SCRATCH, f"shard{s}.log"), "a")
    p = subprocess.Popen([PS_SERVER, "--host=127.0.0.1", f"--port={port}",
                          f"--port_file={port_file}", f"--shard={s}", f"--num_shards={n}",
                          f"--num_workers={workers}", *flags], stdout=log, stderr=log)
    _processes.append(p)
    for _ in range(200):
        if os.path.exists(port_file) and os.path.getsize(port_file) > 0:
            break
        time.sleep(0.05)
    else:
        fail(f"shard {s} did not start: {open(log.name).read()}")
    return p, f"127.0.0.1:{open(port_file).read().strip()}"


def start_shards(n, workers, *flags):
    return [start_shard(s, n, workers, flags)[1] for s in range(n)]


def stop(processes):
    for p in processes:
        p.terminate()
        p.wait()


def run_workers(name, mode, flags=(), env=None, world=2, expect_ok=True, timeout=120,
                during=None, rank_flags=lambda r: [], rank_env=lambda r: {}, script=WORKER):
    """Runs worker.py in `world` processes; returns (outputs, their logs, exit codes).
    `during(outputs)`, if given, runs while they train; rank r also gets rank_flags(r) and
    rank_env(r)."""
    port = free_port()
    procs, outs, logs = [], [], []
    for r in range(world):
        out = os.path.join(SCRATCH, f"{name}.rank{r}.pt")
        log = os.path.join(SCRATCH, f"{name}.rank{r}.log")
        e = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                 LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                 DPTRAIN_MODE=mode)
        e.update(env or {})
        e.update(rank_env(r))
        procs.append(subprocess.Popen([PYTHON, script, out, f"--world={world}", *flags,
                                       *rank_flags(r)],
                                      env=e, stdout=open(log, "w"), stderr=subprocess.STDOUT))
        outs.append(out)
        logs.append(log)
    _processes.extend(procs)
    if during is not None:
        during(outs)
    codes = []
    deadline = time.time() + timeout
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1, deadline - time.time())))
        except subprocess.TimeoutExpired:
            fail(f"{name}: a worker hung: " + " | ".join(open(l).read()[-500:] for l in logs))
    texts = [open(l).read() for l in logs]
    if expect_ok and any(codes):
        fail(f"{name}: exit codes {codes}: " + " | ".join(t[-800:] for t in texts))
    return outs, texts, codes


def reference(name, flags=()):
    out = os.path.join(SCRATCH, f"{name}.reference.pt")
    r = subprocess.run([PYTHON, WORKER, out, "--reference", *flags], capture_output=True,
                       text=True)
    if r.returncode != 0:
        fail(f"{name} reference: {r.stdout} {r.stderr}")
    return out


def compare(name, outs, ref, tolerance=1e-5):
    states = [torch.load(o) for o in outs]
    want = torch.load(ref)
    worst = 0.0
    for key in want:
        for r, s in enumerate(states):
            if not torch.equal(s[key], states[0][key]):
                fail(f"{name}: rank {r}'s {key} differs from rank 0's")
        diff = (states[0][key] - want[key]).abs().max().item()
        scale = want[key].abs().max().item() or 1.0
        worst = max(worst, diff / scale)
    if worst > tolerance:
        fail(f"{name}: weights differ from the single-process run by {worst:.2e} (relative)")
    print(f"ok: {name}: both ranks identical, {worst:.1e} from one process on the global "
          f"batch", flush=True)
    return worst


def summary(out):
    with open(out + ".json") as f:
        return json.load(f)


def main():
    cases = sys.argv[1:] or ["horovod", "sync_bn", "allreduce", "ps", "master", "wire", "server", "passes",
                             "skip",
                             "mismatch", "dead", "tls", "init", "example", "restart", "async", "torchrun",
                             "sparse", "sparse_restart", "load", "click"]
    if "init" in cases:
        r = subprocess.run([PYTHON, "-c", "import dptrain.torch as d\n"
                            "try:\n d.rank()\nexcept d.DptrainError as e:\n print(e)\n"],
                           capture_output=True, text=True)
        if "call dptrain.torch.init() first" not in r.stdout:
            fail(f"use before init: {r.stdout} {r.stderr}")
        print(f"ok: use before init raises: {r.stdout.strip()}")
    if "horovod" in cases:
        # Horovod's collectives and keyword arguments, and DistributedOptimizer off the usual
        # path, in each mode (ps: through 2 shards of their own per script: another model).
        scripts = [
            ("horovod", HOROVOD_API, "Horovod's allgather, allgather_object, allreduce ops "
             "(integers exact), barrier and DistributedOptimizer arguments; ranks in different "
             "collectives or with different roots refused together"),
            ("edges", OPTIMIZER_EDGES, "DistributedOptimizer: a step after 1 of 2 passes "
             "averages that pass; a backward that raised on every rank, caught, and training "
             "goes on; a sparse embedding; both ranks equal to one process on every rank's "
             "batches"),
        ]
        for mode in ("allreduce", "master", "ps"):
            for name, script, what in scripts:
                env = {"DPTRAIN_PS": ",".join(start_shards(2, 2, "--optimizer=none"))} \
                    if mode == "ps" else {}
                outs, _, _ = run_workers(f"{name}_{mode}", mode, env=env, script=script)
                if not all(summary(o)["ok"] for o in outs):
                    fail(f"{name} in {mode} mode")
                print(f"ok: {mode} mode: {what}", flush=True)
    if "example" in cases:
        example()
    if "click" in cases:
        click_example()
    if "load" in cases:
        load_saved_models()
    if "sparse" in cases:
        sparse()
    if "sparse_restart" in cases:
        sparse_restart()
    ref = reference("sgd")
    # The comparisons mean something only if training moves the weights well beyond them.
    start = torch.load(reference("start", ["--steps=0"]))
    moved = max(((torch.load(ref)[k] - start[k]).abs().max() / start[k].abs().max()).item()
                for k in start)
    if moved < 1e-2:
        fail(f"the reference run barely moved the weights ({moved:.1e})")
    if "sync_bn" in cases:
        # SyncBatchNorm: 2 ranks on half batches train as one process whose BatchNorm2d sees
        # the global batch (weights and running statistics), in two modes.
        ref_bn = reference("sync_bn", ["--sync_bn"])
        for mode in ("allreduce", "master"):
            outs, _, _ = run_workers(f"sync_bn_{mode}", mode, ["--sync_bn"])
            compare(f"SyncBatchNorm, {mode}, 2 workers on half batches", outs, ref_bn)
    if "allreduce" in cases:
        outs, _, _ = run_workers("allreduce", "allreduce")
        compare("allreduce, 2 workers, SGD momentum", outs, ref)
    if "ps" in cases:
        shards = start_shards(2, 2, "--optimizer=none")
        outs, _, _ = run_workers("ps", "ps", env={"DPTRAIN_PS": ",".join(shards)})
        compare("ps, 2 shards --optimizer=none, 2 workers", outs, ref)
    if "master" in cases:
        outs, _, _ = run_workers("master", "master")
        compare("master, 2 workers", outs, ref)
    if "wire" in cases:
        # 16-bit gradients on the wire: the shards (or the reducer) sum in fp32; the result
        # moves by the rounding of the pushed values, no more (and it does move: the wire
        # really is 16-bit).
        shards = start_shards(2, 2, "--optimizer=none")
        outs, _, _ = run_workers("wire_ps", "ps", env={"DPTRAIN_PS": ",".join(shards),
                                                       "DPTRAIN_WIRE_DTYPE": "bf16"})
        worst = compare("ps, bf16 on the wire", outs, ref, tolerance=2e-2)
        if not worst > 1e-7:
            fail(f"ps with DPTRAIN_WIRE_DTYPE=bf16 is {worst:.1e} from fp32: not 16-bit?")
        outs, _, _ = run_workers("wire_master", "master", env={"DPTRAIN_WIRE_DTYPE": "fp16"})
        worst = compare("master, fp16 on the wire", outs, ref, tolerance=2e-3)
        if not worst > 1e-8:
            fail(f"master with DPTRAIN_WIRE_DTYPE=fp16 is {worst:.1e} from fp32: not 16-bit?")
        outs, _, _ = run_workers("wire_ring", "allreduce", env={"DPTRAIN_WIRE_DTYPE": "bf16"})
        worst = compare("allreduce, bf16 on the ring", outs, ref, tolerance=2e-2)
        if not worst > 1e-7:
            fail(f"allreduce with DPTRAIN_WIRE_DTYPE=bf16 is {worst:.1e} from fp32: not 16-bit?")
    if "server" in cases:
        shards = start_shards(2, 2, "--optimizer=sgd", "--lr=0.05", "--momentum=0.9")
        outs, _, _ = run_workers("server", "ps", ["--server"],
                                 env={"DPTRAIN_PS": ",".join(shards)})
        compare("ServerOptimizer under BSP (shards: sgd, momentum 0.9)", outs, ref)
    if "torchrun" in cases:
        # Under torchrun (TORCHELASTIC_RUN_ID set) its own store holds MASTER_PORT: dptrain
        # meets on the next port. A listener stands in for torchrun's store here.
        store = socket.socket()
        store.bind(("127.0.0.1", 0))
        store.listen()
        port = store.getsockname()[1]
        outs, _, _ = run_workers("torchrun", "master", env={
            "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": "test"})
        store.close()
        compare("master mode under torchrun's environment (its store on MASTER_PORT)", outs, ref)
    if "restart" in cases:
        restart()
    if "async" in cases:
        logs = f"{SCRATCH}/launcher_async"
        r = subprocess.run([LAUNCHER, "--mode=ps", "--workers=2", "--shard_optimizer=adam",
                            "--lr=0.001", "--sync=async", f"--bin={ROOT}",
                            f"--logs={logs}", "--run", "--", PYTHON,
                            EXAMPLE.replace("train_fashion_mnist", "train_server_optimizer"),
                            "--epochs=2"], capture_output=True, text=True, timeout=300)
        last = [l for l in r.stdout.splitlines() if "epoch 2:" in l]
        accuracies = [float(l.split("test accuracy ")[1].split(",")[0]) for l in last]
        # Async is not deterministic, and its staleness grows with the machine's load. With
        # SGD (0.05, momentum 0.9, with or without a warmup) LeNet stayed on its first plateau
        # at test accuracy 0.10 in 2 of 3 fresh-clone runs of the suite (never in ~50 runs
        # alone or under load here); Adam (0.001) leaves it within the first epoch (0.76 to
        # 0.80 after it, 0.82 to 0.84 after 2, in 8 of 8 runs here). Chance is 0.10: the bound
        # (0.35) says that it trains. A failure shows each shard's last line (pushes applied,
        # staleness, non-finite pushes dropped).
        if r.returncode != 0 or len(accuracies) != 2 or min(accuracies) < 0.35:
            epochs = "\n".join(l for l in r.stdout.splitlines() if "epoch" in l)
            shards = "\n".join(open(f).read().strip().splitlines()[-1]
                               for f in sorted(glob.glob(f"{logs}/shard*.log")))
            fail(f"async ServerOptimizer: exit {r.returncode}, accuracies {accuracies}\n{epochs}\n"
                 f"{shards}\n{r.stderr[-800:]}")
        print("ok: ServerOptimizer under --sync=async, 2 workers, LeNet on Fashion-MNIST, 2 "
              f"epochs: test accuracy {accuracies[0]:.4f} and {accuracies[1]:.4f}")
    if "passes" in cases:
        ref2 = reference("passes", ["--passes=2"])
        outs, _, _ = run_workers("passes", "allreduce", ["--passes=2"])
        compare("backward_passes_per_step=2", outs, ref2)
    if "skip" in cases:
        ref_skip = reference("skip", ["--inf_at=2:1"])
        for mode in ("allreduce", "ps"):
            env = {}
            if mode == "ps":
                env["DPTRAIN_PS"] = ",".join(start_shards(1, 2, "--optimizer=none"))
            outs, _, _ = run_workers(f"skip_{mode}", mode, ["--inf_at=2:1"], env=env)
            if [summary(o)["skipped"] for o in outs] != [1, 1]:
                fail(f"global skip ({mode}): skipped steps {[summary(o) for o in outs]}")
            compare(f"global skip ({mode}): rank 1 overflows at step 2, both skip it", outs,
                    ref_skip)
    if "mismatch" in cases:
        # Rank 1's model has a wider second convolution.
        _, texts, codes = run_workers("mismatch", "allreduce", env={"DPTRAIN_TIMEOUT": "20"},
                                      rank_flags=lambda r: ["--wider"] if r == 1 else [],
                                      expect_ok=False, timeout=60)
        if codes[0] == 0 or codes[1] == 0:
            fail(f"mismatch: exit codes {codes}")
        want = "DistributedOptimizer's parameters differ: at entry"
        if want not in texts[1] or ("rank 1 has '6.weight [10, 160] float32', rank 0 has '6.weight [10, 128] "
                "float32'") not in texts[1]:
            fail(f"mismatch: rank 1 said: {texts[1][-600:]}")
        if "of rank(s) 1 differ from rank 0's" not in texts[0]:
            fail(f"mismatch: rank 0 said: {texts[0][-600:]}")
        print("ok: mismatched tensors fail on both ranks: "
              + next(l for l in texts[1].splitlines() if want in l))
    if "dead" in cases:
        start = time.time()
        outs, texts, codes = run_workers("dead", "allreduce", ["--die_at=3", "--steps=8"],
                                         env={"DPTRAIN_TIMEOUT": "10"}, expect_ok=False)
        took = time.time() - start
        if codes[1] != 3 or codes[0] == 0:
            fail(f"dead worker: exit codes {codes}: {texts[0][-600:]}")
        line = next((l for l in reversed(texts[0].splitlines()) if "DptrainError:" in l), "")
        if "rank 1" not in line:
            fail(f"dead worker: rank 0's error does not name rank 1: {texts[0][-800:]}")
        print(f"ok: a dead worker: rank 0 raised within {took:.0f}s: {line.strip()}")
    if "tls" in cases:
        certs = os.path.join(SCRATCH, "certs")
        subprocess.run([MAKE_CERTS, "--shards=1", "--workers=2", "--force", certs], check=True,
                       capture_output=True)
        for mode in ("allreduce", "ps"):
            env = {"DPTRAIN_TLS_CA": f"{certs}/ca.crt",
                   "DPTRAIN_JOB_TOKEN_FILE": f"{certs}/job_token"}
            flags = ()
            if mode == "ps":
                env["DPTRAIN_PS"] = ",".join(start_shards(
                    1, 2, "--optimizer=none", f"--tls_cert={certs}/ps-0.crt",
                    f"--tls_key={certs}/ps-0.key", f"--tls_ca={certs}/ca.crt",
                    f"--job_token_file={certs}/job_token"))
            outs, _, _ = run_workers(f"tls_{mode}", mode, env=env, rank_env=lambda r: {
                "DPTRAIN_TLS_CERT": f"{certs}/worker-{r}.crt",
                "DPTRAIN_TLS_KEY": f"{certs}/worker-{r}.key"})
            compare(f"{mode} with mutual TLS and the job token", outs, ref)


def load_saved_models():
    """What gpu_worker --save_model writes loads into dptrain.models' networks with
    dptrain.safetensors (PyTorch only), and evaluates as gpu_worker did."""
    import dptrain.models
    import dptrain.safetensors
    sys.path.insert(0, os.path.join(HERE, "..", "examples", "torch"))
    from fashion_mnist import load
    images, labels = load("t10k")
    for model, steps, batch, lr in (("mlp", 100, 64, 0.1), ("lenet", 100, 64, 0.9),
                                    ("resnet18", 4, 16, 0.05)):
        # Built for other data than the default Fashion-MNIST (tests/onnx_e2e_test loads what
        # gpu_worker saved for CIFAR-shaped data into one): any shape, any class count.
        for shape, classes in (((3, 32, 32), 10), ((1, 40, 24), 5)):
            net = getattr(dptrain.models, model)(input=shape, classes=classes)
            out = net(torch.zeros(2, *shape))
            if tuple(out.shape) != (2, classes):
                fail(f"dptrain.models.{model}(input={shape}, classes={classes}) gives {out.shape}")
        saved = os.path.join(SCRATCH, f"{model}.safetensors")
        metrics = os.path.join(SCRATCH, f"{model}.jsonl")
        r = subprocess.run([GPU_WORKER, "--mode=allreduce", "--world_size=1", f"--lr={lr}",
                            f"--model={model}", "--epochs=1", f"--max_steps_per_epoch={steps}",
                            f"--batch_size={batch}", "--test_subset=300", "--threads=1",
                            "--device=cpu", f"--save_model={saved}", f"--metrics_out={metrics}"],
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            fail(f"gpu_worker --save_model ({model}): {r.stdout[-500:]} {r.stderr[-500:]}")
        theirs = [json.loads(l) for l in open(metrics) if '"test_acc"' in l][-1]["test_acc"]
        net = getattr(dptrain.models, model)()
        net.load_state_dict(dptrain.safetensors.load_file(saved))  # Strict: every name.
        net.eval()
        with torch.no_grad():
            ours = (net(images[:300]).argmax(1) == labels[:300]).float().mean().item()
        if abs(ours - theirs) > 1.5 / 300:
            fail(f"{model}: PyTorch evaluates the saved weights at {ours:.4f}, gpu_worker at "
                 f"{theirs:.4f}")
        print(f"ok: {model} saved by gpu_worker loads into dptrain.models.{model}() with "
              f"dptrain.safetensors: test accuracy {ours:.4f} in PyTorch, {theirs:.4f} in "
              "gpu_worker (300 images)", flush=True)


def sparse_prefetch(without):
    """SparseEmbedding.prefetch of the next batch (before and after the optimizer's step, and
    once of ids the next forward does not use): the same bits as `without` (the run without
    prefetching), and every other forward served by the prefetched rows. Then with rank 0's
    forward of step 4 under no_grad, so that its prefetch starts before that step's push
    (which changes rows): that prefetch must be left unused, the bits again the same."""
    def run(name, flags):
        shards = [start_shard(s, 2, 2, ["--optimizer=none", "--step_timeout=30s"])
                  for s in range(2)]
        outs, _, _ = run_workers(name, "allreduce", ["--optimizer=adagrad"] + flags,
                                 env={"DPTRAIN_PS": ",".join(a for _, a in shards)},
                                 script=SPARSE_WORKER)
        stop([p for p, _ in shards])
        return [(torch.load(o), json.load(open(o + ".json"))["stats"]["prefetched"])
                for o in outs]

    def same(a, b):
        return (torch.equal(a["table"], b["table"])
                and all(torch.equal(a["head"][k], b["head"][k]) for k in a["head"]))

    # 8 steps: 7 prefetches, one of ids the next forward does not use.
    for rank, (got, hits) in enumerate(run("sparse_prefetch", ["--prefetch"])):
        if not same(got, without[rank]):
            fail(f"sparse prefetch: rank {rank} differs from the run without prefetch")
        if hits != 6:
            fail(f"sparse prefetch: rank {rank}'s forwards took {hits} prefetched pulls, not 6")
    plain = run("sparse_nograd", ["--nograd_at=4"])
    for rank, (got, hits) in enumerate(run("sparse_nograd_prefetch",
                                           ["--nograd_at=4", "--prefetch"])):
        if not same(got, plain[rank][0]):
            fail(f"sparse prefetch: rank {rank} used rows pulled before a push")
        if hits != (5 if rank == 0 else 6):
            fail(f"sparse prefetch, no_grad step: rank {rank} took {hits} prefetched pulls")
    print("ok: SparseEmbedding.prefetch: 6 of 8 forwards served by the prefetched rows, "
          "the same bits as without; a prefetch that started before a push left unused",
          flush=True)


def sparse():
    """SparseEmbedding: rows on 2 shards, the dense head through the ring, against
    nn.Embedding in one process on the global batch, for each of the shards' rules; one
    worker alone; a bad id and a table declared differently by two workers."""
    # The ids' unique values and inverse by one sort: torch.unique's, exactly.
    g = torch.Generator().manual_seed(5)
    for n, high in ((0, 5), (1, 5), (17, 4), (5000, 100), (20000, 2_000_000)):
        ids = torch.randint(0, high, (n,), generator=g)
        got, want = dpt._unique_ids(ids), torch.unique(ids, return_inverse=True)
        if not all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(got, want)):
            fail(f"_unique_ids differs from torch.unique on {n} ids below {high}")
    for optimizer in ("sgd", "adagrad", "adam"):
        ref_out = os.path.join(SCRATCH, f"sparse_{optimizer}.reference.pt")
        r = subprocess.run([PYTHON, SPARSE_WORKER, ref_out, "--reference",
                            f"--optimizer={optimizer}"], capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"sparse reference: {r.stdout} {r.stderr}")
        want = torch.load(ref_out)
        for world in (2, 1):
            shards = [start_shard(s, 2, world, ["--optimizer=none", "--step_timeout=30s"])
                      for s in range(2)]
            outs, _, _ = run_workers(f"sparse_{optimizer}_{world}", "allreduce",
                                     [f"--optimizer={optimizer}"], world=world,
                                     env={"DPTRAIN_PS": ",".join(a for _, a in shards)},
                                     script=SPARSE_WORKER)
            stop([p for p, _ in shards])
            got = [torch.load(o) for o in outs]
            for g in got[1:]:
                if not (torch.equal(g["table"], got[0]["table"])
                        and all(torch.equal(g["head"][k], got[0]["head"][k]) for k in g["head"])):
                    fail(f"sparse {optimizer}: the ranks differ")
            worst = max((got[0]["table"] - want["table"]).abs().max().item(),
                        max((got[0]["head"][k] - want["head"][k]).abs().max().item()
                            for k in want["head"]))
            moved = (want["table"] - dpt.sparse_initial_weight("clicks", *want["table"].shape)
                     ).abs().max().item()
            if worst > 2e-5 or moved < 1e-2:
                fail(f"sparse {optimizer}, {world} worker(s): {worst:.1e} from nn.Embedding "
                     f"(the reference moved the rows by {moved:.1e})")
            print(f"ok: SparseEmbedding ({optimizer}), {world} worker(s) x 2 shards: "
                  f"{worst:.1e} from nn.Embedding in one process on the global batch "
                  f"(rows moved by up to {moved:.2f})", flush=True)
            if optimizer == "adagrad" and world == 2:
                sparse_prefetch(got)
    # A table of 100M rows x 16 (6.4 GB dense) trained for 200 steps: each worker stays well
    # under 1 GiB and the shards hold only the rows touched.
    shards = [start_shard(s, 2, 2, ["--optimizer=none", "--metrics_port=0",
                                    f"--metrics_port_file={SCRATCH}/sparse_big_m{s}"])
              for s in range(2)]
    outs, _, _ = run_workers("sparse_big", "allreduce",
                             ["--rows=100000000", "--dim=16", "--steps=200", "--optimizer=adagrad"],
                             env={"DPTRAIN_PS": ",".join(a for _, a in shards)},
                             script=SPARSE_WORKER, timeout=300)
    held, metric = 0, {}
    for s in range(2):
        port = open(f"{SCRATCH}/sparse_big_m{s}").read().strip()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        for l in text.splitlines():
            if l.startswith("dptrain_ps_sparse_") and " " in l and "{" not in l:
                name, value = l.split()[:2]
                metric[name] = metric.get(name, 0.0) + float(value)
        held += int(float(next(l.split()[1] for l in text.splitlines()
                               if l.startswith("dptrain_ps_sparse_rows_held "))))
    stop([p for p, _ in shards])
    info = [summary(o) for o in outs]
    rss = max(i["max_rss_bytes"] for i in info)
    touched = info[0]["touched"]
    # The shards hold the rows the batches touched plus the first 10,000 the script reads back.
    if rss > 1 << 30 or held > touched + 10000:
        fail(f"100M-row table: worker peak RSS {rss >> 20} MiB, shards hold {held} rows for "
             f"{touched} touched")
    print(f"ok: a 100M x 16 table (6.4 GB dense), 2 workers x 200 steps: worker peak RSS "
          f"{rss >> 20} MiB, the shards hold {held} rows ({touched} touched by the batches, "
          "at most 10,000 more read back)", flush=True)
    # What the workers and the shards say they moved agrees.
    stats = [i["stats"] for i in info]
    pulled = sum(st["rows_pulled"] for st in stats)
    if (metric.get("dptrain_ps_sparse_rows_pulled_total") != pulled
            or metric.get("dptrain_ps_sparse_bytes_pulled_total") != pulled * 16 * 4
            or not 0 < stats[0]["unique_ratio"] <= 1
            or not metric.get("dptrain_ps_sparse_rows_applied_total", 0) > 0):
        fail(f"sparse counts: workers {stats}, shards {metric}")
    per_row = (metric["dptrain_ps_sparse_apply_seconds_total"]
               / metric["dptrain_ps_sparse_rows_applied_total"])
    print(f"ok: sparse counts agree: {pulled} rows pulled ({stats[0]['unique_ratio']:.2f} "
          f"unique per id looked up on rank 0), {per_row * 1e9:.0f} ns per row update "
          "(adagrad, dim 16) on the shards", flush=True)
    # SparseEmbeddingBag (sum over 1-D ids and offsets) against nn.EmbeddingBag.
    ref_out = os.path.join(SCRATCH, "sparse_bag.reference.pt")
    subprocess.run([PYTHON, SPARSE_WORKER, ref_out, "--reference", "--bag",
                    "--optimizer=adagrad"], check=True, capture_output=True)
    shards = [start_shard(s, 2, 2, ["--optimizer=none"]) for s in range(2)]
    outs, _, _ = run_workers("sparse_bag", "allreduce", ["--bag", "--optimizer=adagrad"],
                             env={"DPTRAIN_PS": ",".join(a for _, a in shards)},
                             script=SPARSE_WORKER)
    stop([p for p, _ in shards])
    want, got = torch.load(ref_out), torch.load(outs[0])
    worst = (got["table"] - want["table"]).abs().max().item()
    if worst > 2e-5:
        fail(f"SparseEmbeddingBag: {worst:.1e} from nn.EmbeddingBag")
    print(f"ok: SparseEmbeddingBag (sum, offsets; adagrad), 2 workers x 2 shards: {worst:.1e} "
          "from nn.EmbeddingBag in one process", flush=True)
    # A bad id, and a table declared differently: one clear error naming the table.
    for name, flags, rank_flags, want_text in (
            ("sparse_bad_id", ["--optimizer=sgd"], lambda r: ["--bad_id"],
             "sparse table 'clicks': id 500 is not in [0, 500)"),
            ("sparse_declared", ["--optimizer=sgd"],
             lambda r: ["--declare_dim=9"] if r == 1 else [],
             "sparse table 'clicks' is declared as 500 rows x "),
            ("sparse_bad_seed", ["--optimizer=sgd"], lambda r: ["--seed=-1"] if r == 1 else [],
             "bad sparse table spec: seed: ")):
        shards = [start_shard(s, 2, 2, ["--optimizer=none", "--step_timeout=5s"])
                  for s in range(2)]
        _, texts, codes = run_workers(name, "allreduce", flags, rank_flags=rank_flags,
                                      env={"DPTRAIN_PS": ",".join(a for _, a in shards),
                                           "DPTRAIN_TIMEOUT": "10"},
                                      expect_ok=False, script=SPARSE_WORKER)
        stop([p for p, _ in shards])
        # The bad id is rank 1's; of two declarations, the one that comes second is refused
        # (either rank may be second), and the other rank then fails too.
        lines = [next((l for l in reversed(t.splitlines()) if "DptrainError:" in l), "")
                 for t in texts]
        line = next((l for l in lines if want_text in l), "")
        if not line or (name in ("sparse_bad_id", "sparse_bad_seed")
                        and want_text not in lines[1]):
            fail(f"{name}: exit codes {codes}, the ranks said: {texts[0][-500:]} | "
                 f"{texts[1][-700:]}")
        if 0 in codes:
            fail(f"{name}: a rank finished although the other failed: exit codes {codes}")
        print(f"ok: {name}: {line.strip()}", flush=True)


def example():
    """The README's example: at most 5 code lines differ from the single-process script, and
    deploy/local_cluster.sh --run trains it in every mode (ps also with --certs)."""
    with open(EXAMPLE.replace(".py", "_single.py")) as f:
        single = f.read().split('"""', 2)[2].splitlines()  # The code after the docstring.
    with open(EXAMPLE) as f:
        worker = f.read().split('"""', 2)[2].splitlines()
    import difflib
    changed = [l for l in difflib.unified_diff(single, worker, lineterm="", n=0)
               if l.startswith("+") and not l.startswith("+++")]
    if len(changed) > 5:
        fail(f"the example changes {len(changed)} lines of the single-process script: {changed}")
    certs = os.path.join(SCRATCH, "launcher_certs")
    subprocess.run([MAKE_CERTS, "--shards=2", "--workers=2", "--force", certs], check=True,
                   capture_output=True)
    for mode, extra in (("allreduce", []), ("master", []), ("ps", [f"--certs={certs}"])):
        r = subprocess.run([LAUNCHER, f"--mode={mode}", "--workers=2", f"--bin={ROOT}",
                            f"--logs={SCRATCH}/launcher_{mode}", *extra, "--run", "--",
                            PYTHON, EXAMPLE, "--epochs=1", "--max_steps=30"],
                           capture_output=True, text=True, timeout=300)
        accuracies = sorted(l.split("test accuracy ")[1].split(",")[0]
                            for l in r.stdout.splitlines() if "test accuracy" in l)
        if r.returncode != 0 or len(accuracies) != 2 or accuracies[0] != accuracies[1]:
            fail(f"launcher --run ({mode}): {r.returncode} {r.stdout[-800:]} {r.stderr[-800:]}")
    print(f"ok: the example differs from the single-process script in {len(changed)} lines and "
          f"trains through deploy/local_cluster.sh --run in allreduce, master and ps (with "
          f"--certs) mode: {accuracies[0]} test accuracy on both ranks after 30 steps")


def click_example():
    """examples/torch/train_click_model.py at small flags (20,000 rows a field, 300,000
    training impressions, a few seconds; the tables prefetching the next batch's rows) through
    deploy/local_cluster.sh --run, 2 workers x 2 shards: its last line parses, names the best possible AUC, and the model learned (its test
    AUC well above chance and near that optimum)."""
    r = subprocess.run([LAUNCHER, "--workers=2", "--shards=2", f"--bin={ROOT}",
                        f"--logs={SCRATCH}/launcher_click", "--run", "--", PYTHON,
                        CLICK_EXAMPLE, "--rows=20000", "--train=300000", "--test=20000",
                        "--evals=1", "--prefetch=1"], capture_output=True, text=True, timeout=300)
    last = next((l for l in reversed(r.stdout.splitlines()) if "test AUC" in l), "")
    m = re.search(r"\] test AUC ([0-9.]+) \(best possible ([0-9.]+)\), gap (-?[0-9.]+)", last)
    if r.returncode != 0 or m is None:
        fail(f"click example: exit {r.returncode}, last line {last!r}: {r.stdout[-800:]} "
             f"{r.stderr[-800:]}")
    got, best = float(m.group(1)), float(m.group(2))
    served = re.search(r"prefetch: ([0-9]+) of the tables' ([0-9]+) training forwards", r.stdout)
    if served is None or not 0 < int(served.group(1)) < int(served.group(2)):
        fail(f"click example: no prefetched rows were used: {r.stdout[-800:]}")
    # At these flags the run is deterministic (BSP, one thread a worker): 0.7346 of 0.7634.
    if not (got > 0.65 and 0.65 < best < 0.9 and best - got < 0.05):
        fail(f"click example: test AUC {got} (best possible {best}): {last}")
    print(f"ok: examples/torch/train_click_model.py (20,000 rows, 300,000 impressions, 2 "
          f"workers x 2 shards): test AUC {got:.4f} (best possible {best:.4f})", flush=True)


def runs_with_a_shard_killed(prefix, flags, worker_flags, kill_at, script=WORKER):
    """The job twice on 2 fresh shards with checkpoints: uninterrupted, then with shard 1
    killed (-9) once rank 0 reached step `kill_at` and restarted on its port. Returns, per run
    (False: uninterrupted, True: killed), the ranks' saved outputs, their logs and what
    ps_status said before the shards stopped, plus the step the shard was killed at."""
    finals, logs, status, killed = {}, {}, {}, {}
    for kill in (False, True):
        name = f"{prefix}_killed" if kill else f"{prefix}_clean"
        shards = [start_shard(s, 2, 2, flags + [f"--checkpoint_dir={SCRATCH}/{name}_ckpt{s}"])
                  for s in range(2)]

        def kill_and_restart(outs, shards=shards, name=name):
            step_file = outs[0] + ".step"
            # 120 s: two Python processes importing torch on a loaded 2-core machine first.
            step = 0
            for _ in range(2400):
                if os.path.exists(step_file):
                    # The worker rewrites the file every step: it may be caught empty.
                    text = open(step_file).read().strip()
                    step = int(text) if text.isdigit() else step
                    if step >= kill_at:
                        break
                time.sleep(0.05)
            else:
                fail(f"{prefix}: the workers never reached step {kill_at}")
            proc, address = shards[1]
            proc.kill()
            proc.wait()
            killed["at"] = step
            time.sleep(0.5)
            start_shard(1, 2, 2, flags + [f"--checkpoint_dir={SCRATCH}/{name}_ckpt1"],
                        port=int(address.split(":")[1]))

        outs, logs[kill], _ = run_workers(name, "ps", worker_flags, script=script,
                                          env={"DPTRAIN_PS": ",".join(a for _, a in shards)},
                                          during=kill_and_restart if kill else None)
        finals[kill] = [torch.load(o) for o in outs]
        status[kill] = subprocess.run([PS_STATUS, "--ps=" + ",".join(a for _, a in shards)],
                                      capture_output=True, text=True)
        stop([p for p, _ in shards])
    return finals, logs, status, killed["at"]


def restart():
    """ServerOptimizer rides out a shard killed (-9) and restarted from its checkpoint: the
    job ends with weights byte-identical to an uninterrupted run."""
    finals, logs, _, at = runs_with_a_shard_killed(
        "restart", ["--optimizer=sgd", "--lr=0.05", "--momentum=0.9", "--checkpoint_every=5",
                    "--step_timeout=20s"], ["--server", "--steps=30", "--sleep=0.05"], 12)
    if "recovered" not in "".join(logs[True]):
        fail(f"restart: no recovery in the workers' logs: {logs[True][0][-800:]}")
    for key in finals[False][0]:
        for r in range(2):
            if not torch.equal(finals[True][r][key], finals[False][0][key]):
                fail(f"restart: rank {r}'s {key} differs from the uninterrupted run")
    print(f"ok: ServerOptimizer: shard 1 killed (-9) at step {at} and restarted from "
          "its checkpoint; final weights byte-identical to an uninterrupted run")


def sparse_restart():
    """Sparse tables and ServerOptimizer's dense head on the same 2 shards (BSP, adagrad rows,
    checkpoints every 5 steps): shard 1 killed (-9) mid-training and restarted from its
    checkpoint; the job goes back to the checkpoint's step and ends byte-identical."""
    finals, logs, status, at = runs_with_a_shard_killed(
        "sparse_restart", ["--optimizer=sgd", "--lr=0.05", "--checkpoint_every=5",
                           "--step_timeout=20s"],
        ["--server", "--steps=30", "--sleep=0.05", "--optimizer=adagrad"], 13,
        script=SPARSE_WORKER)
    for kill in (False, True):
        tables = [l for l in status[kill].stdout.splitlines() if "sparse table 'clicks'" in l]
        if status[kill].returncode != 0 or len(tables) != 2 or "next step 30" not in tables[1]:
            fail(f"sparse restart: ps_status said {status[kill].stdout} {status[kill].stderr}")
    if "the job went back" not in "".join(logs[True]):
        fail(f"sparse restart: the job never went back: {logs[True][0][-800:]}")
    for r in range(2):
        if not torch.equal(finals[True][r]["table"], finals[False][0]["table"]):
            fail(f"sparse restart: rank {r}'s table differs from the uninterrupted run")
        for key, value in finals[False][0]["head"].items():
            if not torch.equal(finals[True][r]["head"][key], value):
                fail(f"sparse restart: rank {r}'s head {key} differs from the uninterrupted run")
    log = open(os.path.join(SCRATCH, "shard1.log")).read()
    restored = [l for l in log.splitlines() if "sparse table 'clicks' restored" in l]
    print(f"ok: sparse table + ServerOptimizer: shard 1 killed (-9) at step {at} and "
          f"restarted ({restored[-1].strip() if restored else 'no restore line'}); table and "
          f"head byte-identical to an uninterrupted run; ps_status:{tables[1]}", flush=True)


if __name__ == "__main__":
    try:
        main()
    finally:
        for p in _processes:
            if p.poll() is None:
                p.kill()
