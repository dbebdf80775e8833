"""DistributedOptimizer where a script leaves the usual path (tests/torch_workers_test.py runs
it in 2 processes per mode), each against the same steps computed in one process from every
rank's batches (gathered bit for bit):
- backward_passes_per_step=2 and a step() after one pass (an epoch's last batch): that pass's
  gradients are averaged over the ranks now, as Horovod's step() does;
- an exception inside backward, caught by every rank, then zero_grad() and the next batch:
  training goes on, the ranks still agree;
throughout, the model has an nn.Embedding(sparse=True), whose sparse gradients are averaged
dense (Horovod's sparse_as_dense).

usage: optimizer_edges.py OUT [--world=N]   (writes OUT.json: {"ok": true, "rank": r})"""

import json
import sys

import torch

import dptrain.torch as hvd

out = sys.argv[1]
torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()


class Fails(torch.autograd.Function):
    """The identity, whose backward raises when `fail` is set (a custom op's bug)."""
    fail = False

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        if Fails.fail:
            raise RuntimeError("a custom backward failed")
        return grad


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)
        self.embedding = torch.nn.Embedding(6, 2, sparse=True)

    def forward(self, batch):
        x, ids = batch
        return self.linear(x) + self.embedding(ids)


torch.manual_seed(0)
net = Net()
reference = Net()
reference.load_state_dict(net.state_dict())
opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                               named_parameters=net.named_parameters(),
                               backward_passes_per_step=2)
ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)


def batch(step, rank):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(3, 4, generator=g), torch.randint(0, 6, (3,), generator=g)


def loss_of(model, x):
    return Fails.apply(model(x)).pow(2).mean()


def reference_step(passes):
    """One step of the reference on every rank's batches of `passes`: the mean over ranks
    of each rank's gradient summed over its passes."""
    ref_opt.zero_grad()
    for p in passes:
        for k in range(n):
            (loss_of(reference, batch(p, k)) / n).backward()
    ref_opt.step()


def agree(what):
    weights = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    every = hvd.allgather(weights.reshape(1, -1))
    if not all(torch.equal(every[k], every[0]) for k in range(n)):
        sys.exit(f"{what}: the ranks' weights differ")
    want = torch.cat([p.detach().reshape(-1) for p in reference.parameters()])
    if not torch.allclose(weights, want, rtol=1e-5, atol=1e-6):
        sys.exit(f"{what}: {(weights - want).abs().max().item():.2e} from the reference")


# A full step of two passes, then a step after one pass.
opt.zero_grad()
for p in (0, 1):
    loss_of(net, batch(p, r)).backward()
opt.step()
reference_step([0, 1])
agree("a step of two passes")
opt.zero_grad()
loss_of(net, batch(2, r)).backward()
opt.step()  # One pass of two: an epoch's end.
reference_step([2])
agree("a step after one pass of backward_passes_per_step=2")

# A backward that raises on every rank (caught), then the script goes on.
opt.zero_grad()
Fails.fail = True
try:
    loss_of(net, batch(3, r)).backward()
    sys.exit("the failing backward did not raise")
except RuntimeError as e:
    if "custom backward failed" not in str(e):
        raise
Fails.fail = False
for step in (4, 5):
    opt.zero_grad()
    for p in (0, 1):
        loss_of(net, batch(10 * step + p, r)).backward()
    opt.step()
    reference_step([10 * step, 10 * step + 1])
    agree(f"step {step}, after a backward that raised")
hvd.shutdown()
with open(out + ".json", "w") as f:
    json.dump({"ok": True, "rank": r}, f)
print(f"rank {r}: optimizer edge cases passed")
