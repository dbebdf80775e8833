"""A click-model-like PyTorch script with a row-sparse embedding table on the parameter-server
shards (dptrain.torch.SparseEmbedding) and a dense head through the ring, run as 1 or 2
workers, or as the single-process reference with nn.Embedding (tests/torch_workers_test.py).

usage: sparse_worker.py OUT [--reference] [--world=N] [--optimizer=sgd|adagrad|adam]
                            [--steps=S] [--dim=D] [--bad_id] [--declare_dim=D] [--bag]
                            [--server [--sleep=SECONDS]] [--prefetch]
--bag: the fields of a row are one bag of an (Sparse)EmbeddingBag (sum, through offsets)
instead of the mean of Embedding rows.
--server: the head through ServerOptimizer (ps mode, the shards' optimizer) instead of the
ring, the loop driven by its step (a shard restarted from its checkpoint sends the job back);
OUT.step holds the step reached, and every step sleeps --sleep.
--seed=S: the table's seed (-1: refused as no uint64).
--nograd_at=K: at step K rank 0's forward of the table runs under no_grad (it pushes no
gradient that step; the other rank does).
--prefetch: each step prefetches the next batch's rows (SparseEmbedding.prefetch), before the
optimizer's step on even steps (the pull waits for the push), after it on odd ones, and
prefetches ids its next forward does not use at step 3 (that forward pulls as usual); after
the step it zeroes the tensor it passed: the result must be the same bits as without."""

import json
import math
import sys
import time

import torch
from torch import nn

args = {"reference": False, "world": 2, "optimizer": "adagrad", "steps": 8, "dim": 8,
        "bad_id": False, "declare_dim": 0, "bag": False, "rows": 500, "server": False,
        "sleep": 0.0, "prefetch": False, "nograd_at": -1, "seed": 0}
out = sys.argv[1]
for a in sys.argv[2:]:
    key, _, value = a.lstrip("-").partition("=")
    if key not in args:
        sys.exit(f"sparse_worker.py: unknown flag {a}")
    args[key] = type(args[key])(value) if value else True
torch.set_num_threads(1)
ROWS, FIELDS, GLOBAL, DIM = args["rows"], 4, 32, args["dim"]
LR = {"sgd": 0.5, "adagrad": 0.1, "adam": 0.05}[args["optimizer"]]
generator = torch.Generator().manual_seed(3)
# Zipf-like ids (log-uniform: a few hot rows, many cold ones, duplicates within a batch),
# drawn without anything the size of the table.
u = torch.rand(args["steps"], GLOBAL, FIELDS, generator=generator, dtype=torch.float64)
ids = (torch.tensor(float(ROWS), dtype=torch.float64) ** u).long().clamp(max=ROWS) - 1
labels = torch.randint(0, 2, (args["steps"], GLOBAL), generator=generator)
torch.manual_seed(11)
head = nn.Linear(DIM, 2)
loss_fn = nn.CrossEntropyLoss()


def features(emb, batch):
    """A row's features: the mean of its fields' rows, or one bag (1-D ids + offsets)."""
    if not args["bag"]:
        return emb(batch).mean(dim=1)
    return emb(batch.reshape(-1), torch.arange(0, batch.numel(), FIELDS))


class LazyAdam:
    """Adam on the rows a step touched only, each row with its own step count: the shards'
    rule, written out on a dense table as the reference."""

    def __init__(self, weight, lr, betas=(0.9, 0.999), eps=1e-10):
        self.w, self.lr, self.b1, self.b2, self.eps = weight, lr, betas[0], betas[1], eps
        self.m, self.v = torch.zeros_like(weight), torch.zeros_like(weight)
        self.t = torch.zeros(weight.shape[0], dtype=torch.int64)

    def step(self, touched):
        with torch.no_grad():
            for r in touched.tolist():
                g = self.w.grad[r]
                self.t[r] += 1
                t = int(self.t[r])
                self.m[r].mul_(self.b1).add_(g, alpha=1 - self.b1)
                self.v[r].mul_(self.b2).addcmul_(g, g, value=1 - self.b2)
                c1, c2 = 1 - self.b1 ** t, math.sqrt(1 - self.b2 ** t)
                denom = (self.v[r].sqrt() / c2).add_(self.eps)
                self.w[r].addcdiv_(self.m[r], denom, value=-self.lr / c1)


if args["reference"]:
    import dptrain.torch as dpt  # For the table's initial rows only.
    emb = nn.EmbeddingBag(ROWS, DIM, mode="sum") if args["bag"] else nn.Embedding(ROWS, DIM)
    with torch.no_grad():
        emb.weight.copy_(dpt.sparse_initial_weight("clicks", ROWS, DIM))
    dense = torch.optim.SGD(head.parameters(), lr=0.1)
    if args["optimizer"] == "sgd":
        sparse = torch.optim.SGD(emb.parameters(), lr=LR)
    elif args["optimizer"] == "adagrad":
        sparse = torch.optim.Adagrad(emb.parameters(), lr=LR, eps=1e-10)
    else:
        sparse = LazyAdam(emb.weight, LR)
    for step in range(args["steps"]):
        dense.zero_grad()
        emb.zero_grad()
        loss = loss_fn(head(features(emb, ids[step])), labels[step])
        loss.backward()
        dense.step()
        sparse.step(torch.unique(ids[step])) if args["optimizer"] == "adam" else sparse.step()
    table = emb.weight.detach().clone()
else:
    import dptrain.torch as dpt
    dpt.init()
    rank, world = dpt.rank(), dpt.size()
    part = GLOBAL // world
    mine = slice(rank * part, (rank + 1) * part)
    kind = dpt.SparseEmbeddingBag if args["bag"] else dpt.SparseEmbedding
    emb = kind(ROWS, args["declare_dim"] or DIM, "clicks", optimizer=args["optimizer"], lr=LR,
               seed=args["seed"], **({"mode": "sum"} if args["bag"] else {}))
    if args["server"]:
        opt = dpt.ServerOptimizer(head.named_parameters())
    else:
        opt = dpt.DistributedOptimizer(torch.optim.SGD(head.parameters(), lr=0.1),
                                       named_parameters=head.named_parameters())
    step = 0
    while step < args["steps"]:
        if args["server"]:
            if opt.steps < step:
                print(f"rank {rank}: the job went back from step {step} to {opt.steps}",
                      flush=True)
            step = opt.steps  # The shards' step: a shard that came back may send us back.
            if step >= args["steps"]:
                break
        opt.zero_grad()
        batch = ids[step][mine]
        if args["bad_id"] and step == 2 and rank == 1:
            batch = batch.clone()
            batch[0, 0] = ROWS  # One past the table.
        if step == args["nograd_at"] and rank == 0:
            with torch.no_grad():  # Nothing pending: a prefetch now starts at once, before
                rows = features(emb, batch)  # this step's push (which changes rows).
        else:
            rows = features(emb, batch)
        loss = loss_fn(head(rows), labels[step][mine])
        loss.backward()
        following = ids[step + 1][mine] if step + 1 < args["steps"] else None
        if step == 3 and following is not None:
            following = following.flip(0)  # Not what the next forward reads.
        prefetch = args["prefetch"] and following is not None
        if prefetch and step % 2 == 0:
            emb.prefetch(following)
        opt.step()  # The head through the ring (or the shards), the rows through the shards.
        if prefetch and step % 2 == 1:
            mine_copy = following.clone()
            emb.prefetch(mine_copy)
            mine_copy.zero_()  # The caller's tensor changes after prefetch: no matter.
        step += 1
        if args["server"]:
            with open(out + ".step", "w") as f:
                f.write(str(step))
            time.sleep(args["sleep"])
    with torch.no_grad():  # The whole table, if it is small enough to look at.
        table = dpt.SparseEmbedding.forward(emb, torch.arange(min(ROWS, 10000)))
    stats = dict(emb.stats, unique_ratio=emb.unique_ratio())
    dpt.shutdown()

torch.save({"table": table, "head": head.state_dict()}, out)
with open(out + ".json", "w") as f:
    import resource
    json.dump({"touched": int(torch.unique(ids).numel()),
               "stats": None if args["reference"] else stats,
               "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}, f)
