"""dptrain.torch against PyTorch DDP (gloo) on this machine: the same training loop, 2
workers x 1 thread, interleaved rounds, medians of job images/s. Also dptrain's ps (2
averaging shards) and master modes, and world size 1 against the plain loop.

usage: eval "$(tools/python_env.sh)"; /usr/bin/python3 tests/bench/torch_modes_bench.py \\
         [--models=mlp,resnet18] [--rounds=3] [--configs=ddp_gloo,...] [--out=FILE]
(dptrain_ps_after / dptrain_master_after: the push starts when backward has ended,
DPTRAIN_OVERLAP=0, for the gain of pushing while backward runs.)
(a benchmark: run it on a quiet machine; it prints the load average before and after.)"""

import json
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
PS_SERVER = os.path.join(ROOT, "bazel-bin", "server", "ps_server")
sys.path.insert(0, os.path.join(ROOT, "examples", "torch"))

# model: (per-worker batch, measured steps, warm-up steps)
MODELS = {"mlp": (128, 300, 20), "resnet18": (32, 30, 3)}
CONFIGS = ["ddp_gloo", "dptrain_allreduce", "dptrain_ps", "dptrain_master",
           "dptrain_ps_after", "dptrain_master_after", "plain_1",
           "dptrain_1"]


def net(name):
    import torch
    from torch import nn
    torch.manual_seed(0)
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))

    class Residual(nn.Module):  # d2l's
        def __init__(self, cin, cout, use_1x1, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, padding=1, stride=stride)
            self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
            self.conv3 = nn.Conv2d(cin, cout, 1, stride=stride) if use_1x1 else None
            self.bn1, self.bn2 = nn.BatchNorm2d(cout), nn.BatchNorm2d(cout)

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return torch.relu(y + (self.conv3(x) if self.conv3 is not None else x))

    def stage(cin, cout, first):  # The first stage keeps the size, the others halve it.
        return [Residual(cin, cout, use_1x1=not first, stride=1 if first else 2),
                Residual(cout, cout, use_1x1=False, stride=1)]

    return nn.Sequential(nn.Conv2d(1, 64, 7, stride=2, padding=3), nn.BatchNorm2d(64),
                         nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1),
                         *stage(64, 64, True), *stage(64, 128, False), *stage(128, 256, False),
                         *stage(256, 512, False), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(512, 10))


def worker(config, model, rank, world):
    """One worker: trains `model` and prints {"images_per_s": job images/s as it saw them}."""
    import torch
    from fashion_mnist import load
    torch.set_num_threads(1)
    batch, steps, warmup = MODELS[model]
    images, labels = load("train")
    m = net(model)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    if config == "ddp_gloo":
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=rank, world_size=world)
        m = torch.nn.parallel.DistributedDataParallel(m, gradient_as_bucket_view=True)
    elif config.startswith("dptrain"):
        import dptrain.torch as dpt
        dpt.init()
        opt = dpt.DistributedOptimizer(opt, named_parameters=m.named_parameters())
    loss_fn = torch.nn.CrossEntropyLoss()
    start = None
    for step in range(warmup + steps):
        if step == warmup:
            start = time.perf_counter()
        at = ((step * world + rank) * batch) % (len(labels) - batch)
        X, y = images[at:at + batch], labels[at:at + batch]
        opt.zero_grad()
        loss_fn(m(X), y).backward()
        opt.step()
    seconds = time.perf_counter() - start
    print(json.dumps({"images_per_s": steps * batch * world / seconds}), flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(config, model):
    world = 1 if config.endswith("_1") else 2
    port = free_port()
    while True:  # master mode's reducer takes MASTER_PORT + 1.
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
            break
        except OSError:
            port = free_port()
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world),
               DPTRAIN_MODE={"dptrain_ps": "ps", "dptrain_master": "master"}.get(
                   config.replace("_after", ""), "allreduce"),
               OMP_NUM_THREADS="1")
    if config.endswith("_after"):  # The push starts when backward has ended (no overlap).
        env["DPTRAIN_OVERLAP"] = "0"
    shards = []
    if config.startswith("dptrain_ps"):
        addresses = []
        for s in range(2):
            port_file = f"/tmp/torch_bench_shard{s}.{os.getpid()}"
            if os.path.exists(port_file):
                os.remove(port_file)
            shards.append(subprocess.Popen(
                [PS_SERVER, "--host=127.0.0.1", "--port=0", f"--port_file={port_file}",
                 f"--shard={s}", "--num_shards=2", f"--num_workers={world}", "--optimizer=none"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            while not (os.path.exists(port_file) and os.path.getsize(port_file)):
                time.sleep(0.05)
            addresses.append(f"127.0.0.1:{open(port_file).read().strip()}")
        env["DPTRAIN_PS"] = ",".join(addresses)
    procs = [subprocess.Popen([sys.executable, __file__, "worker", config, model, str(r),
                               str(world)], env=dict(env, RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(world)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=1200)
        if p.returncode != 0:
            sys.exit(f"{config} {model}: exit {p.returncode}: {err[-1500:]}")
        results.append(json.loads(out.strip().splitlines()[-1])["images_per_s"])
    for s in shards:
        s.terminate()
        s.wait()
    return min(results)  # The job goes at its slowest rank's pace.


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return
    flags = {"models": "mlp,resnet18", "rounds": "3", "out": "", "configs": ",".join(CONFIGS)}
    for a in sys.argv[1:]:
        key, _, value = a.lstrip("-").partition("=")
        flags[key] = value
    import torch
    lines = [f"# tests/bench/torch_modes_bench.py {' '.join(sys.argv[1:])}",
             f"# {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, torch "
             f"{torch.__version__}, {os.cpu_count()} cores, load average before "
             f"{os.getloadavg()[0]:.2f}",
             "# job images/s (slowest rank) per round; 2 workers x 1 thread unless _1 (one "
             "process, 1 thread)"]
    print("\n".join(lines), flush=True)
    table = {}
    for model in flags["models"].split(","):
        for r in range(int(flags["rounds"])):
            for config in flags["configs"].split(","):
                value = run(config, model)
                table.setdefault((model, config), []).append(value)
                print(f"{model} round {r + 1} {config}: {value:.0f}", flush=True)
    lines.append(f"# load average after {os.getloadavg()[0]:.2f}")
    lines.append("model     config              median images/s   vs ddp_gloo  rounds")
    for (model, config), values in table.items():
        median = statistics.median(values)
        base = statistics.median(table.get((model, "ddp_gloo"), [float("nan")]))
        ratio = (f"{median / base:.2f}x" if not config.endswith("_1") else
                 f"(vs plain_1 {median / statistics.median(table[(model, 'plain_1')]):.3f}x)")
        lines.append(f"{model:9} {config:19} {median:15.0f}   {ratio:11}  "
                     + ", ".join(f"{v:.0f}" for v in values))
    print("\n".join(lines[-len(table) - 2:]))
    if flags["out"]:
        with open(flags["out"], "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
