"""A small PyTorch training script, run as a dptrain.torch worker or as the single-process
reference (tests/torch_workers_test.py drives it). A CNN without batch norm on synthetic
data: every step, global batch GLOBAL is split into equal parts, rank r training on part r.

usage: worker.py OUT [--reference] [--world=N] [--steps=S] [--optimizer=sgd|adam]
                     [--server] [--passes=P] [--inf_at=STEP:RANK] [--die_at=STEP]
                     [--wider] [--seed=K] [--cuda] [--amp] [--sync_bn]
OUT receives the final state_dict (torch.save, CPU tensors) and a summary (OUT.json); a
"{rank}" in OUT becomes the rank (for launchers that give every rank the same arguments).
--cuda: the model and the batches on cuda:LOCAL_RANK % device_count, deterministic cuDNN, no
TF32. --sync_bn: a BatchNorm2d after the first convolution, which the workers turn into
dptrain.torch.SyncBatchNorm (the reference keeps BatchNorm2d on the global batch). --amp (with --cuda): fp16 autocast and a GradScaler (initial scale 1024); with
--inf_at the reference overflows at that step too, so that its scaler halves as the
workers' do."""

import json
import os
import sys
import time

import torch
from torch import nn

args = {"reference": False, "world": 2, "steps": 6, "optimizer": "sgd", "server": False,
        "passes": 1, "inf_at": "", "die_at": -1, "wider": False, "seed": 0, "lr": 0.05,
        "sleep": 0.0, "cuda": False, "amp": False, "sync_bn": False}
out = sys.argv[1]
for a in sys.argv[2:]:
    key, _, value = a.lstrip("-").partition("=")
    if key not in args:
        sys.exit(f"worker.py: unknown flag {a}")
    args[key] = type(args[key])(value) if value else True

if args["amp"] and not args["cuda"]:
    sys.exit("worker.py: --amp needs --cuda (fp16 autocast and GradScaler on the GPU)")
torch.manual_seed(args["seed"])
torch.set_num_threads(1)
GLOBAL = 16
device = torch.device("cpu")
if args["cuda"]:
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))
                          % torch.cuda.device_count())
    torch.cuda.set_device(device)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


def model():
    torch.manual_seed(1234)
    width = 10 if args["wider"] else 8
    norm = [nn.BatchNorm2d(4)] if args["sync_bn"] else []
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), *norm, nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(4, width, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(width * 4 * 4, 10))


generator = torch.Generator().manual_seed(7)
data = torch.randn(args["steps"] * args["passes"], GLOBAL, 1, 8, 8, generator=generator)
labels = torch.randint(0, 10, (args["steps"] * args["passes"], GLOBAL), generator=generator)
net = model().to(device)
loss_fn = nn.CrossEntropyLoss()
if args["amp"]:
    if hasattr(torch.amp, "GradScaler"):
        scaler = torch.amp.GradScaler(device.type, init_scale=1024.0)
    else:
        scaler = torch.cuda.amp.GradScaler(init_scale=1024.0)


def forward(x, y):
    if not args["amp"]:
        return loss_fn(net(x.to(device)), y.to(device))
    with torch.autocast(device.type, dtype=torch.float16):
        return loss_fn(net(x.to(device)), y.to(device))


def backward(loss):
    (scaler.scale(loss) if args["amp"] else loss).backward()


def apply(opt):
    """The step; whether it was skipped (an overflow, here or, for the workers, anywhere)."""
    if not args["amp"]:
        opt.step()
        return False
    before = scaler.get_scale()
    scaler.step(opt)
    scaler.update()
    return scaler.get_scale() < before


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
            loss = forward(data[batch], labels[batch])
            if step == inf_step and args["amp"]:
                loss = loss * float("inf")  # The scaler skips it and halves, as the workers'.
            backward(loss)
        if args["amp"]:
            summary["skipped"] += int(apply(opt))
        elif step != inf_step:  # The distributed run skips that step on every rank.
            opt.step()
else:
    import dptrain.torch as dpt

    dpt.init()
    if args["sync_bn"]:
        net = dpt.SyncBatchNorm.convert_sync_batchnorm(net)
    rank, world = dpt.rank(), dpt.size()
    out = out.replace("{rank}", str(rank))
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
            loss = forward(data[batch][mine], labels[batch][mine])
            if step == inf_step and rank == inf_rank:
                loss = loss * float("inf")  # This rank's gradients overflow.
            backward(loss)
        if args["server"]:
            skipped = opt.step()
        elif args["amp"]:
            skipped = apply(opt)
        else:
            skipped = (opt.step(), opt.skipped_last_step)[1]
        summary["skipped"] += int(bool(skipped))
        step += 1
        with open(out + ".step", "w") as f:
            f.write(str(step))
        time.sleep(args["sleep"])
    summary["rank"] = rank
    dpt.shutdown()

if args["amp"]:
    summary["scale"] = scaler.get_scale()
summary["device"] = str(device)
torch.save({k: v.cpu() for k, v in net.state_dict().items()}, out)
with open(out + ".json", "w") as f:
    json.dump(summary, f)
