"""Horovod's API names beyond training, as a Horovod script calls them (tests/
torch_workers_test.py runs it in 2 processes per mode): allgather of uneven first dimensions,
bit for bit in any dtype; allgather_object; allreduce with op=Sum/Average and Horovod's scale
factors; barrier; DistributedOptimizer with Horovod's keyword arguments; and the clear errors
for what dptrain does not do (Adasum, op=Sum for gradients, fp16 compression on an fp32 job).

usage: horovod_api.py OUT [--world=N]   (writes OUT.json: {"ok": true, "rank": r})"""

import json
import sys

import torch

import dptrain.torch as hvd

out = sys.argv[1]
hvd.init()
r, n = hvd.rank(), hvd.size()


def expect_error(what, call, code):
    try:
        call()
    except hvd.DptrainError as e:
        if e.code != code:
            sys.exit(f"{what}: {e.code} ({e}), expected {code}")
        return str(e)
    sys.exit(f"{what}: no error")


def rows(k):  # Rank k's part: k + 2 rows of 3 int64s, distinct from every other rank's.
    return torch.arange(3 * (k + 2), dtype=torch.int64).reshape(k + 2, 3) + 1000 * k


gathered = hvd.allgather(rows(r), name="rows")
if not torch.equal(gathered, torch.cat([rows(k) for k in range(n)])):
    sys.exit(f"allgather: {gathered}")
values = torch.randn(2, 4, generator=torch.Generator().manual_seed(r))  # Not fp32-exact sums.
gathered = hvd.allgather(values)
for k in range(n):
    want = torch.randn(2, 4, generator=torch.Generator().manual_seed(k))
    if not torch.equal(gathered[2 * k:2 * k + 2], want):
        sys.exit(f"allgather of floats: rank {k}'s part is not bit for bit")
objects = hvd.allgather_object({"rank": r, "name": f"worker {r}"})
if objects != [{"rank": k, "name": f"worker {k}"} for k in range(n)]:
    sys.exit(f"allgather_object: {objects}")

mine = torch.tensor([float(r + 1)])
checks = {
    "op=Sum": (hvd.allreduce(mine, op=hvd.Sum), n * (n + 1) / 2),
    "op=Average": (hvd.allreduce(mine, op=hvd.Average), (n + 1) / 2),
    "default": (hvd.allreduce(mine), (n + 1) / 2),
    "average=False": (hvd.allreduce(mine, average=False), n * (n + 1) / 2),
    "scale factors": (hvd.allreduce(mine, op=hvd.Sum, prescale_factor=4.0,
                                    postscale_factor=0.25), n * (n + 1) / 2),
}
for what, (got, want) in checks.items():
    if got.item() != want:
        sys.exit(f"allreduce {what}: {got.item()}, expected {want}")
# Integers are summed exactly (fp32 would round both: 2^40 + ... and 2^24 + 1 are not floats).
counts = torch.tensor([2**40 + 1 + r, 2**24 + 1], dtype=torch.int64)
want = torch.tensor([n * (2**40 + 1) + n * (n - 1) // 2, n * (2**24 + 1)], dtype=torch.int64)
if not torch.equal(hvd.allreduce(counts, op=hvd.Sum), want):
    sys.exit(f"allreduce of int64 counts: {hvd.allreduce(counts, op=hvd.Sum)}, expected {want}")
expect_error("allreduce of a complex tensor", lambda: hvd.allreduce(torch.ones(2, dtype=torch.cfloat)),
             "INVALID_ARGUMENT")
expect_error("allreduce op=Adasum", lambda: hvd.allreduce(mine, op=hvd.Adasum),
             "INVALID_ARGUMENT")
expect_error("allreduce with op and average", lambda: hvd.allreduce(mine, average=True,
                                                                   op=hvd.Sum),
             "INVALID_ARGUMENT")
expect_error("allreduce op=Max", lambda: hvd.allreduce(mine, op=hvd.Max), "INVALID_ARGUMENT")
expect_error("a process set", lambda: hvd.allreduce(mine, process_set=object()),
             "INVALID_ARGUMENT")
# Compression is the gradients' business: a metric's allreduce ignores it (summed in fp32).
if hvd.allreduce(mine, op=hvd.Sum, compression=hvd.Compression.fp16).item() != n * (n + 1) / 2:
    sys.exit("allreduce with compression=fp16")
# A scalar is refused on every rank together (no rank left waiting in a collective).
expect_error("allgather of a scalar", lambda: hvd.allgather(torch.tensor(1.0)),
             "INVALID_ARGUMENT")
hvd.barrier()

# SyncBatchNorm on rank r's half of a batch normalises with the whole batch's statistics:
# its output is BatchNorm's on the whole batch (every rank's halves, in rank order), and so
# are the running statistics (momentum 0.1 and None, with and without affine), and in
# evaluation it is BatchNorm with those statistics.
whole = torch.randn(2 * n, 3, 4, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
half = whole[2 * r:2 * r + 2]
for momentum, affine in ((0.1, True), (None, False)):
    plain = torch.nn.BatchNorm2d(3, momentum=momentum, affine=affine).double()
    synced = hvd.SyncBatchNorm.convert_sync_batchnorm(
        torch.nn.BatchNorm2d(3, momentum=momentum, affine=affine).double())
    if not isinstance(synced, hvd.SyncBatchNorm):
        sys.exit("convert_sync_batchnorm did not convert")
    for _ in range(2):
        want, got = plain(whole)[2 * r:2 * r + 2], synced(half)
        if not torch.allclose(got, want, rtol=0, atol=1e-5):
            sys.exit(f"SyncBatchNorm(momentum={momentum}, affine={affine}) differs from "
                     f"BatchNorm on the whole batch by {(got - want).abs().max():.1e}")
    for key in ("running_mean", "running_var", "num_batches_tracked"):
        if not torch.allclose(getattr(synced, key).double(), getattr(plain, key).double(),
                              rtol=0, atol=1e-6):
            sys.exit(f"SyncBatchNorm's {key}: {getattr(synced, key)} vs {getattr(plain, key)}")
    plain.eval()
    synced.eval()
    if not torch.allclose(synced(half), plain(half), rtol=0, atol=1e-6):
        sys.exit("SyncBatchNorm in evaluation is not BatchNorm with its running statistics")

# Without running statistics, evaluation normalises each rank's batch by its own statistics
# and never synchronises (torch.nn's: ranks may evaluate different numbers of batches).
untracked = hvd.SyncBatchNorm(3, track_running_stats=False).double().eval()
local = torch.nn.BatchNorm2d(3, track_running_stats=False).double().eval()
if not torch.allclose(untracked(half), local(half), rtol=0, atol=1e-6):
    sys.exit("SyncBatchNorm(track_running_stats=False) in evaluation is not the local one")

torch.manual_seed(0)
net = torch.nn.Linear(4, 2)
sgd = torch.optim.SGD(net.parameters(), lr=0.1)
expect_error("op=Sum for gradients", lambda: hvd.DistributedOptimizer(
    sgd, named_parameters=net.named_parameters(), op=hvd.Sum), "INVALID_ARGUMENT")
message = expect_error("fp16 compression on an fp32 job", lambda: hvd.DistributedOptimizer(
    sgd, named_parameters=net.named_parameters(), compression=hvd.Compression.fp16),
    "FAILED_PRECONDITION")
if "wire_dtype" not in message:
    sys.exit(f"the fp16 compression error does not say what to set: {message}")
opt = hvd.DistributedOptimizer(sgd, named_parameters=net.named_parameters(),
                               compression=hvd.Compression.none, backward_passes_per_step=1,
                               op=hvd.Average, gradient_predivide_factor=2.0, num_groups=1,
                               sparse_as_dense=True)
hvd.broadcast_parameters(net.state_dict(), root_rank=0)
x = torch.randn(8, 4, generator=torch.Generator().manual_seed(10 + r))
opt.zero_grad()
net(x).pow(2).mean().backward()
opt.step()
# Every rank applied the same averaged step: the weights agree bit for bit.
weights = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
every = hvd.allgather(weights.reshape(1, -1))
if not all(torch.equal(every[k], every[0]) for k in range(n)):
    sys.exit("the ranks' weights differ after one step")

# Ranks in different collectives, or with different roots, fail together in one line (the
# collective's kind and root are part of what they check), and the job goes on.
refusals = {
    "broadcast roots that differ": lambda: hvd.broadcast(mine, root_rank=r),
    "broadcast_object roots that differ": lambda: hvd.broadcast_object(r, root_rank=r),
    "broadcast_parameters roots that differ":
        lambda: hvd.broadcast_parameters(net.state_dict(), root_rank=r),
    "a barrier beside a broadcast":
        (lambda: hvd.barrier()) if r == 0 else (lambda: hvd.broadcast(mine, root_rank=0)),
    "broadcast_object beside broadcast_optimizer_state":
        (lambda: hvd.broadcast_object(5)) if r == 0 else
        (lambda: hvd.broadcast_optimizer_state(sgd)),
    "allreduce's mean beside a sum": lambda: hvd.allreduce(mine, op=[hvd.Average, hvd.Sum][r % 2]),
}
message = expect_error("broadcast_object of a lambda", lambda: hvd.broadcast_object(lambda: 1),
                       "INVALID_ARGUMENT")
if "could not serialise" not in message:
    sys.exit(f"broadcast_object of a lambda: {message}")
plain = torch.nn.Linear(2, 2)
with torch.no_grad():
    plain.weight.add_(r)  # Apart before the broadcast.
hvd.broadcast_parameters(list(plain.parameters()), root_rank=0)  # Horovod takes these too.
every = hvd.allgather(plain.weight.detach().reshape(1, -1))
if not torch.equal(every[0], every[-1]):
    sys.exit("broadcast_parameters(model.parameters()) left the ranks apart")
expect_error("named_parameters=model.parameters()", lambda: hvd.DistributedOptimizer(
    torch.optim.SGD(plain.parameters(), lr=0.1), named_parameters=plain.parameters()),
    "INVALID_ARGUMENT")
for what, call in refusals.items():
    message = expect_error(what, call, "FAILED_PRECONDITION")
    if "differ" not in message:
        sys.exit(f"{what}: {message}")
if hvd.allreduce(mine, op=hvd.Sum).item() != n * (n + 1) / 2:
    sys.exit("an allreduce after the refused collectives")
hvd.shutdown()
with open(out + ".json", "w") as f:
    json.dump({"ok": True, "rank": r}, f)
print(f"rank {r}: Horovod API checks passed")
