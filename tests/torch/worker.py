"""A small PyTorch training script, run as a dptrain.torch worker or as the single-process
reference (tests/torch_workers_test.py drives it). A CNN without batch norm on synthetic
data: every step, global batch GLOBAL is split into equal parts, rank r training on part r.

usage: worker.py OUT [--reference] [--world=N] [--steps=S] [--optimizer=sgd|adam]
                     [--server] [--passes=P] [--inf_at=STEP:RANK] [--die_at=STEP]
                     [--wider] [--seed=K]
OUT receives the final state_dict (torch.save) and a summary (OUT.json)."""

import json
import os
import sys
import time

import torch
from torch import nn

args = {"reference": False, "world": 2, "steps": 6, "optimizer": "sgd", "server": False,
        "passes": 1, "inf_at": "", "die_at": -1, "wider": False, "seed": 0, "lr": 0.05,
        "sleep": 0.0}
out = sys.argv[1]
for a in sys.argv[2:]:
    key, _, value = a.lstrip("-").partition("=")
    if key not in args:
        sys.exit(f"worker.py: unknown flag {a}")
    args[key] = type(args[key])(value) if value else True

torch.manual_seed(args["seed"])
torch.set_num_threads(1)
GLOBAL = 16


def model():
    torch.manual_seed(1234)
    width = 10 if args["wider"] else 8
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(4, width, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(width * 4 * 4, 10))


generator = torch.Generator().manual_seed(7)
data = torch.randn(args["steps"] * args["passes"], GLOBAL, 1, 8, 8, generator=generator)
labels = torch.randint(0, 10, (args["steps"] * args["passes"], GLOBAL), generator=generator)
net = model()
loss_fn = nn.CrossEntropyLoss()


def make_optimizer(params):
    if args["optimizer"] == "adam":
        return torch.optim.Adam(params, lr=0.01)
    return torch.optim.SGD(params, lr=args["lr"], momentum=0.9)


summary = {"skipped": 0}
inf_step, inf_rank = (int(x) for x in args["inf_at"].split(":")) if args["inf_at"] else (-1, -1)

if args["reference"]:
    opt = make_optimizer(net.parameters())
    for step in range(args["steps"]):
        opt.zero_grad()
        for p in range(args["passes"]):
            batch = step * args["passes"] + p
            loss = loss_fn(net(data[batch]), labels[batch])
            loss.backward()
        if step != inf_step:  # The distributed run skips that step on every rank.
            opt.step()
else:
    import dptrain.torch as dpt

    dpt.init()
    rank, world = dpt.rank(), dpt.size()
    part = GLOBAL // world
    mine = slice(rank * part, (rank + 1) * part)
    if args["server"]:
        opt = dpt.ServerOptimizer(net.named_parameters())
    else:
        opt = dpt.DistributedOptimizer(make_optimizer(net.parameters()),
                                       named_parameters=net.named_parameters(),
                                       backward_passes_per_step=args["passes"])
        dpt.broadcast_parameters(net.state_dict(), root_rank=0)
        dpt.broadcast_optimizer_state(opt, root_rank=0)
    step = 0
    while step < args["steps"]:
        if args["server"]:
            step = opt.steps  # The shards' step: a shard that came back may send us back.
            if step >= args["steps"]:
                break
        if step == args["die_at"] and rank == 1:
            os._exit(3)  # A worker that dies mid-job.
        opt.zero_grad()
        for p in range(args["passes"]):
            batch = step * args["passes"] + p
            loss = loss_fn(net(data[batch][mine]), labels[batch][mine])
            if step == inf_step and rank == inf_rank:
                loss = loss * float("inf")  # This rank's gradients overflow.
            loss.backward()
        skipped = opt.step() if args["server"] else (opt.step(), opt.skipped_last_step)[1]
        summary["skipped"] += int(bool(skipped))
        step += 1
        with open(out + ".step", "w") as f:
            f.write(str(step))
        time.sleep(args["sleep"])
    summary["rank"] = rank
    dpt.shutdown()

torch.save(net.state_dict(), out)
with open(out + ".json", "w") as f:
    json.dump(summary, f)
