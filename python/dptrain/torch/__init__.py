"""PyTorch training scripts as workers of dptrain's parameter server, ring all-reduce or
master reducer, with Horovod's API names, so that an existing script ports by renaming:

    import dptrain.torch as dpt
    dpt.init()                                    # RANK, WORLD_SIZE, DPTRAIN_MODE, ...
    opt = dpt.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    dpt.broadcast_parameters(model.state_dict(), root_rank=0)
    dpt.broadcast_optimizer_state(opt, root_rank=0)

The environment is torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT; under torchrun, whose store holds MASTER_PORT, the port after it; DPTRAIN_PORT
overrides) plus DPTRAIN_MODE=allreduce|ps|master (default allreduce), DPTRAIN_PS (the
shards, host:port,...), DPTRAIN_JOB_ID, DPTRAIN_TIMEOUT (seconds) and the security files
DPTRAIN_TLS_CERT, DPTRAIN_TLS_KEY, DPTRAIN_TLS_CA, DPTRAIN_JOB_TOKEN_FILE; init()'s keyword
arguments win. Every call but the getters is collective: every rank makes it, in the same
order, with tensors of the same names, shapes and dtypes (checked; a difference fails on
every rank, naming the tensor and both ranks). A dead or stopped peer makes the others raise
DptrainError within the timeout."""

import contextlib
import ctypes
import io
import os
import pickle
import queue
import threading

import torch

from dptrain._native import DptrainError, Session, initial_rows

__all__ = ["DptrainError", "init", "shutdown", "is_initialized", "rank", "size", "local_rank",
           "local_size", "mode", "allreduce", "allreduce_", "allgather", "allgather_object",
           "barrier", "broadcast", "broadcast_", "Average", "Sum", "Adasum", "Min", "Max",
           "Product", "Compression", "SyncBatchNorm",
           "broadcast_object", "broadcast_parameters", "broadcast_optimizer_state",
           "DistributedOptimizer", "ServerOptimizer", "SparseEmbedding", "SparseEmbeddingBag",
           "sparse_initial_weight"]

_state = None  # (session, local_rank, local_size, mode, wire_dtype) after init().


def _env_int(name, default):
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise DptrainError(f"{name}={value!r} is not an integer") from None


def _port():
    """Where rank 0 listens: DPTRAIN_PORT, else MASTER_PORT, except under torchrun
    (TORCHELASTIC_RUN_ID set), whose own store holds MASTER_PORT: then the port after it.
    Master mode's reducer takes the port after this one."""
    explicit = _env_int("DPTRAIN_PORT", 0)
    if explicit:
        return explicit
    port = _env_int("MASTER_PORT", 0)
    return port + 1 if port and os.environ.get("TORCHELASTIC_RUN_ID") else port


def init(**overrides):
    """Joins the job. Keyword arguments (mode, rank, size, local_rank, local_size, ps,
    master_addr, master_port, job_id, timeout, connect_timeout, reconnect_timeout,
    bind_address, advertise_host, tls_cert, tls_key, tls_ca, job_token_file, wire_dtype) win
    over the environment (wire_dtype: DPTRAIN_WIRE_DTYPE, fp32 | bf16 | fp16, what
    DistributedOptimizer's gradients travel as: half the bytes in 16 bits, summed in fp32).
    In allreduce mode every rank waits here for the others (up to connect_timeout)."""
    global _state
    if _state is not None:
        raise DptrainError("dptrain.torch.init() was already called (shutdown() first)")
    known = {"mode", "rank", "size", "local_rank", "local_size", "ps", "master_addr",
             "master_port", "job_id", "timeout", "connect_timeout", "reconnect_timeout",
             "bind_address", "advertise_host", "tls_cert", "tls_key", "tls_ca",
             "job_token_file", "wire_dtype"}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise DptrainError(f"init() got unknown arguments {unknown} (known: {sorted(known)})")
    o = dict(overrides)
    ps = o.get("ps", os.environ.get("DPTRAIN_PS", ""))
    if isinstance(ps, str):
        ps = [a.strip() for a in ps.split(",") if a.strip()]
    options = {
        "mode": o.get("mode", os.environ.get("DPTRAIN_MODE", "allreduce")),
        "rank": int(o.get("rank", _env_int("RANK", 0))),
        "world_size": int(o.get("size", _env_int("WORLD_SIZE", 1))),
        "job_id": o.get("job_id", os.environ.get("DPTRAIN_JOB_ID", "dptrain")),
        "ps": list(ps),
        "master_addr": o.get("master_addr", os.environ.get("MASTER_ADDR", "127.0.0.1")),
        "master_port": int(o.get("master_port", _port())),
        "timeout_s": float(o.get("timeout", os.environ.get("DPTRAIN_TIMEOUT", 60))),
    }
    for key in ("connect_timeout", "reconnect_timeout"):
        if key in o:
            options[key + "_s"] = float(o[key])
    for key in ("bind_address", "advertise_host"):
        if key in o:
            options[key] = o[key]
    wire = o.get("wire_dtype", os.environ.get("DPTRAIN_WIRE_DTYPE", "fp32"))
    if wire != "fp32":
        options["wire_dtype"] = wire
    for key, var in (("tls_cert", "DPTRAIN_TLS_CERT"), ("tls_key", "DPTRAIN_TLS_KEY"),
                     ("tls_ca", "DPTRAIN_TLS_CA"), ("job_token_file", "DPTRAIN_JOB_TOKEN_FILE")):
        value = o.get(key, os.environ.get(var, ""))
        if value:
            options[key] = value
    local_rank = int(o.get("local_rank", _env_int("LOCAL_RANK", 0)))
    local_size = int(o.get("local_size", _env_int("LOCAL_WORLD_SIZE", 1)))
    session = Session(options)
    _state = (session, local_rank, local_size, options["mode"], wire)


def shutdown():
    """Leaves the job (closes links and servers). init() may be called again."""
    global _state
    for table in _sparse_tables:
        table._drop_prefetch()  # No pull may still run on the session closed below.
    _sparse_tables.clear()
    if _state is not None:
        _state[0].close()
        _state = None


def is_initialized():
    return _state is not None


def _session():
    if _state is None:
        raise DptrainError("dptrain.torch is not initialised: call dptrain.torch.init() first")
    return _state[0]


def rank():
    return _session().rank()


def size():
    return _session().world_size()


def local_rank():
    _session()
    return _state[1]


def local_size():
    _session()
    return _state[2]


def mode():
    _session()
    return _state[3]


# ---- Collectives on tensors. Device tensors are staged through host memory.

def _describe(name, tensor):
    return f"{name} {list(tensor.shape)} {str(tensor.dtype).replace('torch.', '')}"


def _words(nbytes):
    return torch.zeros((nbytes + 3) // 4, dtype=torch.float32)


def _copy_bytes(dst_address, src_address, nbytes):
    if nbytes:
        ctypes.memmove(dst_address, src_address, nbytes)


# Horovod's reduction ops and compressors, by its names (hvd.Average, hvd.Compression.fp16).
Average = "Average"
Sum = "Sum"
Adasum = "Adasum"
Min = "Min"
Max = "Max"
Product = "Product"


class Compression:
    """Horovod's gradient compressors. `fp16` asks for 16-bit gradients, which dptrain sets for
    the whole job at init (wire_dtype; DPTRAIN_WIRE_DTYPE) and sums in fp32."""
    none = "none"
    fp16 = "fp16"


def _averages(average, op, what):
    """Whether a reduction averages (Horovod's `average` and `op`), or a DptrainError."""
    if op is None:
        return average is None or bool(average)
    if average is not None:
        raise DptrainError(f"{what}: give `op` or `average`, not both", "INVALID_ARGUMENT")
    if op == Average:
        return True
    if op == Sum:
        return False
    raise DptrainError(f"{what}: op={op!r} is not supported (Average or Sum)",
                       "INVALID_ARGUMENT")


def _whole_job(process_set, what):
    """Horovod's process sets: only the whole job's (the default) is one here."""
    if process_set is not None:
        raise DptrainError(f"{what}: process sets are not supported (every collective spans "
                           "the whole job)", "INVALID_ARGUMENT")


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """A new tensor: the mean over ranks of `tensor` (op=Sum or average=False: the sum),
    computed in fp32 whatever `compression` asks (Horovod's signature); `tensor` times
    prescale_factor before, the result times postscale_factor after."""
    out = tensor.detach().clone()
    allreduce_(out, average=average, name=name, compression=compression, op=op,
               prescale_factor=prescale_factor, postscale_factor=postscale_factor,
               process_set=process_set)
    return out


def allreduce_(tensor, average=None, name=None, compression=Compression.none, op=None,
               prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """In place: `tensor` becomes the mean (or sum) over ranks, computed in fp32."""
    session = _session()
    average = _averages(average, op, "allreduce")
    _whole_job(process_set, "allreduce")
    name = name or "allreduce"
    # The kind of collective is part of what must agree: a rank in another collective fails.
    session.check_same("allreduce's tensor", f"allreduce ({'mean' if average else 'sum'}) of "
                       f"{_describe(name, tensor)}")
    if tensor.is_complex():
        raise DptrainError("allreduce: complex tensors are not supported (reduce "
                           "torch.view_as_real(tensor))", "INVALID_ARGUMENT")
    if not tensor.is_floating_point():
        # Integers (and bools) are summed exactly, as Horovod does, from every rank's values
        # gathered bit for bit (fp32 would round sums beyond 2^24).
        flat = tensor.detach().reshape(1, -1)
        if prescale_factor != 1.0:
            flat = (flat.double() * prescale_factor).to(tensor.dtype)
        total = allgather(flat, name=name).sum(0, dtype=torch.int64)
        result = total.double() / session.world_size() if average else total
        if postscale_factor != 1.0:
            result = result.double() * postscale_factor
        with torch.no_grad():
            tensor.copy_(result.reshape(tensor.shape))
        return tensor
    # Device tensors are staged through pinned memory; the result goes back asynchronously
    # (PyTorch keeps a pinned block from reuse until the copies reading it are done).
    buffer = torch.empty(tensor.shape, dtype=torch.float32, pin_memory=tensor.is_cuda)
    buffer.copy_(tensor.detach())
    if prescale_factor != 1.0:
        buffer.mul_(prescale_factor)
    session.allreduce(buffer.data_ptr(), buffer.numel(), average)
    if postscale_factor != 1.0:
        buffer.mul_(postscale_factor)
    with torch.no_grad():
        tensor.copy_(buffer, non_blocking=True)
    return tensor


def allgather(tensor, name=None, process_set=None):
    """A new tensor: every rank's `tensor` concatenated along dimension 0 in rank order (the
    first dimensions may differ; the others and the dtype must not), bit for bit."""
    session = _session()
    _whole_job(process_set, "allgather")
    rest = list(tensor.shape[1:])
    # Every rank checks the same description before any refusal, so that all refuse together.
    shape = f"[*, {', '.join(map(str, rest))}]" if tensor.dim() > 0 else "[] (no dimension)"
    session.check_same("allgather's tensor",
                       f"allgather of {name or 'allgather'}: {tensor.dtype} {shape}")
    if tensor.dim() == 0:
        raise DptrainError("allgather: a tensor without dimensions (give it one: "
                           "tensor.reshape(1))", "INVALID_ARGUMENT")
    # Each rank's row count in two fp32 slots (high and low 23 bits), each summed with zeros
    # only: exact for any count below 2^46.
    size, me, rows = session.world_size(), session.rank(), tensor.shape[0]
    counts = torch.zeros(2 * size, dtype=torch.float32)
    counts[2 * me], counts[2 * me + 1] = float(rows >> 23), float(rows & ((1 << 23) - 1))
    session.allreduce(counts.data_ptr(), counts.numel(), False)
    parts = []
    for r in range(size):
        count = (int(counts[2 * r]) << 23) + int(counts[2 * r + 1])
        part = (tensor.detach().clone() if r == me else
                torch.empty([count] + rest, dtype=tensor.dtype, device=tensor.device))
        _broadcast_tensors([(f"{name or 'allgather'}[{r}]", part)], r, "allgather's part",
                           check=False)
        parts.append(part)
    return torch.cat(parts)


def allgather_object(obj, name=None, process_set=None):
    """Every rank's `obj` (anything torch.save takes), as a list in rank order."""
    _whole_job(process_set, "allgather_object")
    return [_broadcast_object(obj, r, "allgather_object") for r in range(size())]


def barrier(process_set=None):
    """Returns once every rank has called it."""
    _whole_job(process_set, "barrier")
    allreduce_(torch.zeros(1), name="barrier")


def _broadcast_tensors(tensors, root_rank, what, check=True):
    """Rank root_rank's values of `tensors` (a list of (name, tensor)) reach every rank, bit
    for bit, in one message (any dtypes). `check`: every rank's tensors must be described
    alike (off where the caller checked what must agree)."""
    session = _session()
    if check:  # The collective and its root first: ranks that disagree on them fail together.
        session.check_same(what, "\n".join([f"{what} from rank {root_rank}"] +
                                           [_describe(n, t) for n, t in tensors]))
    hosts = [t.detach().to("cpu").contiguous() for _, t in tensors]
    sizes = [h.numel() * h.element_size() for h in hosts]
    buffer = _words(sum(sizes))
    at = buffer.data_ptr()
    if session.rank() == root_rank:
        for h, n in zip(hosts, sizes):
            _copy_bytes(at, h.data_ptr(), n)
            at += n
    session.broadcast(buffer.data_ptr(), buffer.numel(), root_rank)
    if session.rank() != root_rank:
        at = buffer.data_ptr()
        for (_, t), h, n in zip(tensors, hosts, sizes):
            _copy_bytes(h.data_ptr(), at, n)
            at += n
            with torch.no_grad():
                t.copy_(h.view_as(t))


def broadcast_(tensor, root_rank, name=None):
    """In place: rank root_rank's `tensor` on every rank."""
    _broadcast_tensors([(name or "broadcast", tensor)], root_rank, "broadcast's tensor")
    return tensor


def broadcast(tensor, root_rank, name=None):
    """A new tensor holding rank root_rank's `tensor`."""
    out = tensor.detach().clone()
    return broadcast_(out, root_rank, name)


def broadcast_parameters(params, root_rank=0):
    """Rank root_rank's values of `params` (a state_dict, or an iterable of (name, tensor))
    on every rank, in place."""
    items = sorted(params.items()) if isinstance(params, dict) else list(params)
    # model.parameters() works too (as Horovod's): the tensors take their places' names.
    items = [item if isinstance(item, tuple) else (f"param.{i}", item)
             for i, item in enumerate(items)]
    items = [(n, t) for n, t in items if torch.is_tensor(t)]
    _broadcast_tensors(items, root_rank, "broadcast_parameters' tensors")


def broadcast_object(obj, root_rank=0):
    """Rank root_rank's `obj` (anything torch.save takes) on every rank."""
    return _broadcast_object(obj, root_rank, "broadcast_object")


def _broadcast_object(obj, root_rank, what):
    session = _session()
    # Every rank in the same collective (`what`) from the same root, or all fail together.
    session.check_same(what, f"{what} from rank {root_rank}")
    payload, failure = b"", None
    if session.rank() == root_rank:
        stream = io.BytesIO()
        try:
            torch.save(obj, stream)
            payload = stream.getvalue()
        except Exception as e:  # Not picklable (a lambda...): every rank raises, none hangs.
            failure = e
    length = torch.zeros(2, dtype=torch.float32)
    sent = -1 if failure is not None else len(payload)
    ctypes.memmove(length.data_ptr(), ctypes.byref(ctypes.c_int64(sent)), 8)
    session.broadcast(length.data_ptr(), 2, root_rank)
    count = ctypes.c_int64()
    ctypes.memmove(ctypes.byref(count), length.data_ptr(), 8)
    if count.value < 0:
        raise DptrainError(f"{what}: rank {root_rank} could not serialise its object with "
                           f"torch.save: {failure if failure is not None else 'see its error'}",
                           "INVALID_ARGUMENT")
    buffer = _words(count.value)
    if session.rank() == root_rank:
        ctypes.memmove(buffer.data_ptr(), payload, len(payload))
    session.broadcast(buffer.data_ptr(), buffer.numel(), root_rank)
    if session.rank() == root_rank:
        return obj
    data = ctypes.string_at(buffer.data_ptr(), count.value)
    # Any picklable object, from rank 0 of this job (as torch.distributed's
    # broadcast_object_list); torch >= 2.6 would otherwise load tensors and primitives only.
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Rank root_rank's optimizer state (momentum buffers, Adam's moments, step counts and
    the hyper-parameters of every group) loaded into `optimizer` on every rank."""
    state = _broadcast_object(optimizer.state_dict(), root_rank, "broadcast_optimizer_state")
    if _session().rank() != root_rank:
        optimizer.load_state_dict(state)


# ---- DistributedOptimizer.

_BUCKET_BYTES = 25 << 20
_FIRST_BUCKET_BYTES = 1 << 20  # Small, so that communication starts early (as DDP's).


class _DistributedOptimizer(torch.optim.Optimizer):
    """The methods mixed into the wrapped optimizer's class (see DistributedOptimizer)."""

    def __init__(self, params, named_parameters, backward_passes_per_step, bucket_bytes):
        super(self.__class__, self).__init__(params)
        session = _session()
        if backward_passes_per_step < 1:
            raise DptrainError("backward_passes_per_step must be >= 1")
        params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        if named_parameters is not None:
            named = list(named_parameters)
            if not all(isinstance(item, tuple) and len(item) == 2 and torch.is_tensor(item[1])
                       for item in named):
                raise DptrainError("named_parameters must be (name, parameter) pairs: pass "
                                   "model.named_parameters()", "INVALID_ARGUMENT")
            names = {}
            for n, p in named:
                if id(p) in names:
                    continue  # Tied weights: one name.
                if n in names.values():
                    raise DptrainError(f"named_parameters names '{n}' twice")
                names[id(p)] = n
            missing = [i for i, p in enumerate(params) if id(p) not in names]
            if missing:
                raise DptrainError(f"{len(missing)} parameter(s) of the optimizer are not in "
                                   "named_parameters (pass model.named_parameters())")
        else:
            names = {id(p): f"param.{i}" for i, p in enumerate(params)}
        # Backward produces the last layers' gradients first: lay them out first, in
        # buckets of about bucket_bytes, so that the first buckets can travel while the
        # earlier layers are still computing (allreduce mode).
        self._order = list(reversed(params))
        self._names = [names[id(p)] for p in self._order]
        session.check_same("DistributedOptimizer's parameters",
                           "\n".join(_describe(n, p) for n, p in zip(self._names, self._order)))
        complex_ = [n for n, p in zip(self._names, self._order) if p.is_complex()]
        if complex_:
            raise DptrainError(f"DistributedOptimizer: complex parameters ({complex_[0]}) are not "
                               "supported (keep them as torch.view_as_real pairs)",
                               "INVALID_ARGUMENT")
        self._offsets, total = [], 0
        self._buckets, self._bucket_of = [], {}
        bucket_start, bucket_bytes_now = 0, 0
        for i, p in enumerate(self._order):
            self._offsets.append(total)
            total += p.numel()
            bucket_bytes_now += p.numel() * 4
            cap = min(bucket_bytes, _FIRST_BUCKET_BYTES) if not self._buckets else bucket_bytes
            if bucket_bytes_now >= cap or i == len(self._order) - 1:
                self._buckets.append((bucket_start, i + 1))
                bucket_start, bucket_bytes_now = i + 1, 0
        for b, (first, end) in enumerate(self._buckets):
            for i in range(first, end):
                self._bucket_of[i] = b
        self._total = total
        # CUDA gradients travel through pinned host memory: copied out (device to host) on a
        # side stream per device as backward produces them, each bucket's copies marked by
        # an event that the bucket's sender waits on; the averages go back (host to device)
        # on the current stream, and the next backward waits for that before the host
        # writes into _flat again. CPU-only jobs use none of this.
        devices = sorted({p.device for p in params if p.device.type == "cuda"}, key=str)
        self._cuda = bool(devices)
        self._flat = torch.zeros(total + 1, dtype=torch.float32, pin_memory=self._cuda)
        self._side = {d: torch.cuda.Stream(d) for d in devices}
        self._copied = [{d: torch.cuda.Event() for d in devices} for _ in self._buckets]
        self._copied_back = {d: torch.cuda.Event() for d in devices}
        # Host fp32 parameters keep their gradient inside the flat buffer (as DDP's
        # gradient_as_bucket_view): backward accumulates in place and the average lands in
        # p.grad without a copy. Others (devices, other dtypes) are copied in and out.
        self._views = [self._flat[at:at + p.numel()].view_as(p)
                       if p.device.type == "cpu" and p.dtype == torch.float32 else None
                       for at, p in zip(self._offsets, self._order)]
        self._passes = backward_passes_per_step
        self._mode = mode()
        session.register_gradients(self._names, [p.numel() for p in self._order])
        self._session = session
        self._index = {id(p): i for i, p in enumerate(self._order)}
        self._pass = 0  # Backward passes since the last synchronisation.
        self._skipped = False
        self._last_step_skipped = False
        self._in_backward = False
        # Buckets leave as backward produces them: allreduce reduces each on the ring; ps and
        # master start one push (Session.reduce_begin) whose chunks leave for their shards as
        # the buckets covering them complete (reduce_ready).
        self._overlap = size() > 1
        self._push = self._mode in ("ps", "master")
        # DPTRAIN_OVERLAP=0 (for measurements): ps and master mode let the push start only
        # when backward has ended, as before.
        self._push_early = os.environ.get("DPTRAIN_OVERLAP", "1") != "0"
        self._pushing = False  # reduce_begin called, reduce_end not yet.
        self._error = None
        self._hooks = []
        self._queue = None
        if size() > 1:
            self._register_hooks()

    # -- Hooks: a gradient is ready once its accumulator ran backward_passes_per_step times.

    def _register_hooks(self):
        self._accumulators = []  # Keep them alive.
        for p in self._order:
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            self._hooks.append(acc.register_hook(self._make_hook(p)))
            self._accumulators.append(acc)
        if self._overlap:
            self._queue = queue.Queue()
            self._nonfinite = False
            self._done = threading.Condition()
            self._reduced = 0
            worker = threading.Thread(target=self._communicate, daemon=True,
                                      name="dptrain-buckets")
            worker.start()

    def _make_hook(self, p):
        i = self._index[id(p)]

        def hook(*_):
            if not self._in_backward:
                self._in_backward = True
                self._ready = [False] * len(self._order)
                self._bucket_pending = [end - first for first, end in self._buckets]
                self._next_bucket = 0
                for event in self._copied_back.values():
                    event.synchronize()  # The last averages left _flat: it may be written.
                torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
            if self._pass == self._passes - 1:
                self._mark_ready(i)  # Final for this step: packed now (sent now: allreduce).
        return hook

    def _in_place(self, i):
        """Whether parameter i's gradient is its view of the flat buffer."""
        grad, view = self._order[i].grad, self._views[i]
        return (grad is not None and view is not None and not grad.is_sparse and
                grad.data_ptr() == view.data_ptr())

    def _pack(self, i):
        if self._in_place(i):
            return
        p, at, n = self._order[i], self._offsets[i], self._order[i].numel()
        target = self._flat[at:at + n]
        if p.grad is None:
            target.zero_()
        elif p.device.type == "cuda":
            grad = p.grad.detach()
            grad = (grad.to_dense() if grad.is_sparse else grad).reshape(-1)
            side = self._side[p.device]
            side.wait_stream(torch.cuda.current_stream(p.device))  # The gradient is computed.
            with torch.cuda.stream(side):
                target.copy_(grad, non_blocking=True)
            grad.record_stream(side)  # Its memory is not reused before the copy is done.
        elif p.grad.is_sparse:  # nn.Embedding(sparse=True): densified (sparse_as_dense).
            target.copy_(p.grad.detach().to_dense().reshape(-1))
        else:
            target.copy_(p.grad.detach().reshape(-1))
        if self._views[i] is not None:
            p.grad = self._views[i]  # From now on backward accumulates in place.

    def _mark_ready(self, i):
        if self._ready[i]:
            return
        self._ready[i] = True
        self._pack(i)
        b = self._bucket_of[i]
        self._bucket_pending[b] -= 1
        # Buckets leave in index order, the same on every rank.
        while (self._next_bucket < len(self._buckets)
               and self._bucket_pending[self._next_bucket] == 0):
            b = self._next_bucket
            for device, event in self._copied[b].items():
                event.record(self._side[device])  # After every copy of bucket b's gradients.
            self._queue.put(b)
            self._next_bucket += 1

    def _communicate(self):
        while True:
            b = self._queue.get()
            first, end = self._buckets[b]
            start = self._offsets[first]
            stop = self._offsets[end - 1] + self._order[end - 1].numel()
            try:
                if self._error is None:
                    for event in self._copied[b].values():
                        event.synchronize()  # Bucket b's device gradients are in _flat.
                    if self._push:
                        if b == 0:
                            self._flat[self._total] = 0.0  # The shards find any inf/NaN.
                            self._session.reduce_begin(self._flat.data_ptr(),
                                                       self._flat.numel())
                            self._pushing = True
                        if self._push_early or b == len(self._buckets) - 1:
                            self._session.reduce_ready(stop)
                    else:
                        self._session.allreduce_gradient(self._flat.data_ptr() + 4 * start,
                                                         stop - start)
                        # inf/NaN anywhere on any rank is in the average: every rank skips.
                        if not bool(torch.isfinite(self._flat[start:stop]).all()):
                            self._nonfinite = True
            except DptrainError as e:
                self._error = e
            with self._done:
                self._reduced += 1
                self._done.notify_all()

    def _backward_done(self):
        """At the end of every backward: once backward_passes_per_step passes are in, the
        average of every rank's gradients replaces the local ones."""
        self._in_backward = False
        self._pass += 1
        if self._pass < self._passes:
            return  # Accumulating: no synchronisation this pass.
        self._reduce()

    def _reduce(self):
        """The average over ranks of every gradient accumulated since the last one."""
        self._pass = 0
        self._skipped = False
        # Hooks run only with peers (size() > 1), so this always overlaps.
        # Unused parameters (no gradient this pass) travel as they are, or as zeros.
        for i in range(len(self._order)):
            self._mark_ready(i)
        with self._done:
            self._done.wait_for(lambda: self._reduced == len(self._buckets))
            self._reduced = 0
        if self._error is not None:
            error, self._error = self._error, None
            if self._pushing:  # The step cannot complete: end the push (nothing is applied).
                self._pushing = False
                self._session.reduce_cancel()
                try:
                    self._session.reduce_end()
                except DptrainError:
                    pass
            raise error
        if self._push:
            self._pushing = False
            self._skipped = self._session.reduce_end()
            if self._skipped:
                # Every rank skips: GradScaler (found_inf) and step() see it alike.
                self._flat[:self._total] = float("nan")
        else:
            self._skipped, self._nonfinite = self._nonfinite, False
        for i, p in enumerate(self._order):
            if self._in_place(i):
                continue
            at, n = self._offsets[i], p.numel()
            mean = self._flat[at:at + n].view_as(p)
            if p.grad is None or p.grad.is_sparse:
                p.grad = torch.empty_like(p)
            p.grad.detach().copy_(mean, non_blocking=True)  # Host to device: asynchronous.
        for device, event in self._copied_back.items():
            event.record(torch.cuda.current_stream(device))

    # -- Horovod's API.

    def synchronize(self):
        """Averaged gradients are in place as soon as backward returns (the last pass of
        backward_passes_per_step); kept for scripts written for Horovod."""

    @contextlib.contextmanager
    def skip_synchronize(self):
        """For Horovod's `synchronize(); clip; with skip_synchronize(): step()` pattern."""
        yield

    @property
    def skipped_last_step(self):
        """Whether the last step() skipped: some rank's gradients had inf/NaN (every rank
        skips it)."""
        return self._last_step_skipped

    def _check_backward_ended(self):
        """After a backward that raised (autograd then drops _backward_done): resets for the next
        one if none of its gradients left; else no rank can agree any more: DptrainError."""
        if not self._in_backward:
            return
        if self._next_bucket > 0 or self._pushing:
            raise DptrainError("a backward pass raised after some of its gradients left for the "
                               "other ranks: the ranks are out of step (restart the job)",
                               "FAILED_PRECONDITION")
        self._in_backward = False

    def zero_grad(self, *args, **kwargs):  # The wrapped class's defaults (they differ by torch).
        self._check_backward_ended()  # A script that caught backward's exception goes on.
        return super(self.__class__, self).zero_grad(*args, **kwargs)

    def step(self, closure=None):
        self._check_backward_ended()
        if self._pass > 0 and self._queue is not None:
            # Fewer passes than backward_passes_per_step (an epoch's end): what accumulated is
            # averaged now, as Horovod's step() does, or the ranks would part.
            self._reduce()
        self._last_step_skipped = skipped = self._skipped
        self._skipped = False
        result = None if skipped else super(self.__class__, self).step(closure)
        _push_sparse(skipped)  # Global skip: no rank applies a step that overflowed somewhere.
        return result


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         bucket_cap_mb=_BUCKET_BYTES / (1 << 20)):
    """`optimizer` (any torch.optim optimizer, LR schedulers work on the result) whose step()
    applies gradients averaged over all ranks through the job's mode. Gradients leave in
    buckets as backward produces them (allreduce mode: a ring all-reduce per bucket; ps and
    master: one push per step whose chunks leave as the buckets covering them complete), so
    communication overlaps backward, and the averages are in
    p.grad when backward returns, so clipping and GradScaler (scaler.step(opt)) see them. A
    step whose gradients had inf/NaN on any rank is skipped by every rank.

    Horovod's arguments, in its order: `compression=Compression.fp16` needs the job's gradients
    in 16 bits (init(wire_dtype="fp16"), summed in fp32); `op` must be Average (the shards
    and the reducer average); `gradient_predivide_factor` (> 0) splits Horovod's averaging
    without changing its result, and `num_groups`, `groups` and `sparse_as_dense` group or
    densify what dptrain buckets and densifies anyway: accepted, no effect."""
    if compression not in (Compression.none, Compression.fp16):
        raise DptrainError(f"DistributedOptimizer: compression={compression!r} is not "
                           "Compression.none or Compression.fp16", "INVALID_ARGUMENT")
    _session()  # Initialised: the job's wire dtype is known.
    if compression == Compression.fp16 and _state[4] != "fp16":
        raise DptrainError("DistributedOptimizer: compression=Compression.fp16 needs the job's "
                           f"gradients in fp16 (they travel as {_state[4]}): "
                           "dpt.init(wire_dtype='fp16') or DPTRAIN_WIRE_DTYPE=fp16 (summed in "
                           "fp32)", "FAILED_PRECONDITION")
    if op != Average:
        raise DptrainError(f"DistributedOptimizer: op={op!r} is not supported: gradients are "
                           "averaged (op=Average)", "INVALID_ARGUMENT")
    if not gradient_predivide_factor > 0:
        raise DptrainError("DistributedOptimizer: gradient_predivide_factor must be > 0",
                           "INVALID_ARGUMENT")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, backward_passes_per_step,
               int(bucket_cap_mb * (1 << 20)))


def _sum_over_ranks(columns):
    """The per-channel sums of `columns` (a list of [C] tensors) over every rank, in one fp32
    allreduce, as float64 tensors on the columns' device."""
    stacked = torch.stack([c.detach().to(torch.float32) for c in columns]).cpu().contiguous()
    _session().allreduce(stacked.data_ptr(), stacked.numel(), False)
    return [row.to(device=columns[0].device, dtype=torch.float64) for row in stacked]


class _SyncBatchNormFunction(torch.autograd.Function):
    """Batch normalisation over the whole job's batch: the statistics and, in backward, the
    sums the input's gradient needs are allreduced (PyTorch's SyncBatchNorm, computed here in
    float64 per channel)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        c = x.shape[1]
        dims = [d for d in range(x.dim()) if d != 1]
        x64 = x.detach().to(torch.float64)
        count = torch.full((c,), float(x.numel() // c), dtype=torch.float64, device=x.device)
        total, sums = _sum_over_ranks([count, x64.sum(dims)])
        mean = sums / total
        shape = [1, c] + [1] * (x.dim() - 2)
        centred = x64 - mean.view(shape)
        (squares,) = _sum_over_ranks([centred.pow(2).sum(dims)])
        var = squares / total  # Biased, for the normalisation.
        invstd = (var + eps).rsqrt()
        xhat = centred * invstd.view(shape)
        y = xhat * weight.detach().to(torch.float64).view(shape) + \
            bias.detach().to(torch.float64).view(shape)
        ctx.save_for_backward(xhat, invstd, weight)
        ctx.total = total
        ctx.dims = dims
        ctx.input_dtype = x.dtype
        unbiased = var * total / (total - 1).clamp(min=1)
        ctx.mark_non_differentiable(mean, unbiased)
        return y.to(x.dtype), mean, unbiased

    @staticmethod
    def backward(ctx, dy, _mean_grad, _var_grad):
        xhat, invstd, weight = ctx.saved_tensors
        shape = [1, xhat.shape[1]] + [1] * (xhat.dim() - 2)
        dy64 = dy.to(torch.float64)
        local_dy, local_dy_xhat = dy64.sum(ctx.dims), (dy64 * xhat).sum(ctx.dims)
        sum_dy, sum_dy_xhat = _sum_over_ranks([local_dy, local_dy_xhat])
        dx = (weight.detach().to(torch.float64) * invstd).view(shape) * (
            dy64 - (sum_dy / ctx.total).view(shape) -
            xhat * (sum_dy_xhat / ctx.total).view(shape))
        # The parameters' gradients are this rank's share: DistributedOptimizer averages them.
        return (dx.to(ctx.input_dtype), local_dy_xhat.to(weight.dtype),
                local_dy.to(weight.dtype), None)


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """Horovod's (and torch.nn's) SyncBatchNorm: in training, the mean and variance of every
    channel over the whole job's batch (every rank's samples), and the running statistics
    from them, so that N ranks on batches of B train as one process on N * B; in evaluation,
    the running statistics, as BatchNorm. Inputs [N, C, ...]; every rank must call it the
    same number of times (each call is collective). `convert_sync_batchnorm(module)` swaps a
    model's BatchNorm layers for it, keeping their state."""

    def _check_input_dim(self, x):
        if x.dim() < 2:
            raise DptrainError(f"SyncBatchNorm: expected an input [N, C, ...], got {x.dim()}-D",
                               "INVALID_ARGUMENT")

    def forward(self, x):
        self._check_input_dim(x)
        if not self.training:  # As torch.nn's: evaluation never synchronises.
            track = self.track_running_stats  # Else this batch's own statistics.
            return torch.nn.functional.batch_norm(
                x, self.running_mean if track else None, self.running_var if track else None,
                self.weight, self.bias, not track, 0.0, self.eps)
        weight = self.weight if self.affine else torch.ones(self.num_features, device=x.device)
        bias = self.bias if self.affine else torch.zeros(self.num_features, device=x.device)
        y, mean, unbiased = _SyncBatchNormFunction.apply(x, weight, bias, self.eps)
        if self.training and self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                m = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                     else self.momentum)
                self.running_mean.mul_(1 - m).add_(mean.to(self.running_mean.dtype), alpha=m)
                self.running_var.mul_(1 - m).add_(unbiased.to(self.running_var.dtype), alpha=m)
        return y

    @classmethod
    def convert_sync_batchnorm(cls, module):
        """`module` with every BatchNorm1d/2d/3d replaced by a SyncBatchNorm holding the same
        parameters and running statistics (as torch.nn.SyncBatchNorm.convert_sync_batchnorm)."""
        out = module
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and \
                not isinstance(module, cls):
            out = cls(module.num_features, module.eps, module.momentum, module.affine,
                      module.track_running_stats)
            if module.affine:
                with torch.no_grad():
                    out.weight = module.weight
                    out.bias = module.bias
            if module.track_running_stats:
                out.running_mean = module.running_mean
                out.running_var = module.running_var
                out.num_batches_tracked = module.num_batches_tracked
            out.train(module.training)
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child))
        return out


class ServerOptimizer:
    """ps mode with the shards' own optimizer (ps_server --optimizer, --lr, schedules,
    --sync=bsp|ssp|async, checkpoints): step() pushes this rank's gradients and loads the
    weights the shards computed into the parameters. Rank 0's parameters initialise the
    shards of a new job; every rank starts from the shards' current weights (a worker that
    rejoins a running job resumes at its step, `self.steps`)."""

    def __init__(self, named_parameters):
        session = _session()
        named = [(n, p) for n, p in named_parameters if p.requires_grad]
        self._names = [n for n, _ in named]
        self._params = [p for _, p in named]
        session.check_same("ServerOptimizer's parameters",
                           "\n".join(_describe(n, p) for n, p in named))
        self._total = sum(p.numel() for p in self._params)
        self._weights = torch.cat([p.detach().to("cpu", torch.float32).reshape(-1)
                                   for p in self._params])
        self._gradient = torch.zeros(self._total + 1, dtype=torch.float32)
        self._session = session
        self.steps = session.start_server(self._names, [p.numel() for p in self._params],
                                          self._weights.data_ptr(), self._total)
        self._unpack()
        self.skipped_steps = 0

    def _unpack(self):
        at = 0
        with torch.no_grad():
            for p in self._params:
                n = p.numel()
                p.copy_(self._weights[at:at + n].view_as(p))
                at += n

    def zero_grad(self, set_to_none=True):
        for p in self._params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def step(self):
        at = 0
        for p in self._params:
            n = p.numel()
            if p.grad is None:
                self._gradient[at:at + n].zero_()
            else:
                self._gradient[at:at + n].copy_(p.grad.detach().reshape(-1))
            at += n
        self._gradient[self._total] = 0.0
        skipped, rewind = self._session.push_pull(self.steps, self._gradient.data_ptr(),
                                                  self._weights.data_ptr(), self._total)
        self._unpack()
        if rewind >= 0:  # A shard came back from an older checkpoint: so do the tables.
            self.steps = rewind
            _rewind_sparse(self, rewind)
            return skipped
        self.steps += 1
        self.skipped_steps += int(skipped)
        _push_sparse(server=self)
        return skipped

    def _rewind(self, step):
        """Every shard's dense weights back to `step` (their checkpoint of it), loaded."""
        self._session.rewind(step, self._weights.data_ptr(), self._total)
        self._unpack()
        self.steps = step


# ---- Row-sparse embedding tables on the parameter-server shards.

_sparse_tables = []  # The SparseEmbedding modules of this session.


def sparse_initial_weight(name, num_embeddings, embedding_dim, seed=0):
    """The whole start of table `name` (what its rows are before any step), for tests and
    references: num_embeddings x embedding_dim, N(0, 1) as nn.Embedding's."""
    ids = torch.arange(num_embeddings, dtype=torch.int64)
    out = torch.empty(num_embeddings, embedding_dim, dtype=torch.float32)
    initial_rows(seed, name, ids.data_ptr(), num_embeddings, embedding_dim, out.data_ptr())
    return out


def _push_sparse(skipped=False, server=None):
    """Every table's push of this step. A shard that came back from an older checkpoint
    (the push answers OUT_OF_RANGE or ABORTED) takes the whole job back to the oldest step
    any table or the dense weights are at (`server`: ServerOptimizer's dense weights)."""
    behind = False
    for table in _sparse_tables:
        try:
            table.push(skipped)
        except DptrainError as e:
            if e.code not in ("OUT_OF_RANGE", "ABORTED"):
                raise
            behind = True
    if behind:
        _rewind_sparse(server, None)


def _rewind_sparse(server, dense_step):
    """After a shard restart: every table (and, with `server`, the dense weights, which went
    back to `dense_step` already when it is not None) goes to the oldest step any of them is
    at on any shard; the training loop recomputes from `server.steps` (the data order must
    be a function of the step, as in tests/torch/sparse_worker.py)."""
    if not _sparse_tables:
        return
    session = _session()
    steps = [session.sparse_step(t.table) for t in _sparse_tables]
    target = min(steps + ([dense_step] if dense_step is not None else []))
    if server is None:
        raise DptrainError(
            f"a parameter-server shard went back to step {target} (restarted from its "
            f"checkpoint) while this worker's dense parameters are past it: only "
            f"ServerOptimizer's dense weights go back with the sparse tables; restart the job",
            "FAILED_PRECONDITION")
    if dense_step is None or target < dense_step:
        server._rewind(target)
    server.steps = target
    for t in _sparse_tables:
        t._drop_prefetch()
        session.sparse_rollback(t.table, target)
        t.steps = target
        t._pending = []


def _unique_ids(flat):
    """torch.unique(flat, return_inverse=True) for a 1-D int64 CPU tensor (the sorted unique
    ids, and each id's place among them), by one sort: about 3x faster than torch.unique's
    on a batch's ids (20,000 of 2M: 0.95 vs 2.9 ms with Debian's torch 1.13)."""
    ordered, order = torch.sort(flat)
    unique, inverse_of_ordered = torch.unique_consecutive(ordered, return_inverse=True)
    inverse = torch.empty_like(inverse_of_ordered)
    inverse[order] = inverse_of_ordered
    return unique, inverse


class SparseEmbedding(torch.nn.Module):
    """Drop-in for nn.Embedding whose table lives on the parameter-server shards (DPTRAIN_PS,
    in any mode), split by row, so it may be larger than any worker: forward(ids) pulls only
    the rows of the batch's unique ids; their gradients go to the shards when the
    DistributedOptimizer or ServerOptimizer steps (or by push()), where the table's own
    optimizer updates just those rows: sgd, adagrad (torch.optim.Adagrad's rule) or adam
    (lazy: per-row step counts). Every worker declares the table identically; rows start as
    sparse_initial_weight() says. The shards' --sync=bsp averages the workers' gradients of a
    step (async: each applies at once). prefetch(next_ids) pulls the next batch's rows in the
    background while this step finishes."""

    def __init__(self, num_embeddings, embedding_dim, name, optimizer="adagrad", lr=0.01,
                 eps=1e-10, betas=(0.9, 0.999), seed=0):
        super().__init__()
        self.num_embeddings, self.embedding_dim, self.table = (num_embeddings, embedding_dim,
                                                               name)
        self._session = _session()
        self.steps = self._session.sparse_declare({
            "name": name, "rows": num_embeddings, "dim": embedding_dim, "optimizer": optimizer,
            "lr": lr, "eps": eps, "beta1": betas[0], "beta2": betas[1], "seed": seed})
        self._pending = []  # (unique ids, their rows as a leaf tensor) per forward.
        self._prefetched = None  # prefetch()'s pull: see _Prefetch.
        # What this worker moved: ids looked up, the unique ones among them (rows pulled),
        # rows pushed; bytes are rows x embedding_dim x 4; forwards whose rows prefetch()
        # had pulled.
        self.stats = {"ids": 0, "rows_pulled": 0, "rows_pushed": 0, "prefetched": 0}
        _sparse_tables.append(self)

    def unique_ratio(self):
        """Rows pulled per id looked up so far (1.0: no id repeated within a batch)."""
        return self.stats["rows_pulled"] / max(1, self.stats["ids"])

    def _flat_ids(self, ids):
        """ids as one CPU int64 vector, each checked against the table's size."""
        flat = ids.detach().reshape(-1).to("cpu", torch.int64).contiguous()
        if flat.numel():
            low, high = int(flat.min()), int(flat.max())
            if low < 0 or high >= self.num_embeddings:
                bad = low if low < 0 else high
                raise DptrainError(f"sparse table '{self.table}': id {bad} is not in [0, "
                                   f"{self.num_embeddings})")
        return flat

    def prefetch(self, ids):
        """Starts pulling the rows of `ids` (the next batch's) on a background thread, so
        that the next forward() with the same ids finds them there instead of waiting for the
        shards. The pull starts when this table's pending gradients are pushed (the
        optimizer's step), or at once if none are pending, and its rows are used only if no
        push came after it: with the shards' --sync=bsp they are exactly the rows forward's
        own pull would read. A forward with other ids pulls as usual. Bad ids raise here."""
        flat = self._flat_ids(ids)
        self._drop_prefetch()
        self._prefetched = _Prefetch(self, flat)
        if not self._pending:
            self._prefetched.start()

    def _drop_prefetch(self):
        """Forgets prefetch()'s pull (waiting for it if it is running)."""
        if self._prefetched is not None:
            self._prefetched.join()
            self._prefetched = None

    def forward(self, ids):
        flat = self._flat_ids(ids)
        try:  # A failed prefetch raises once; the next forward pulls again.
            taken = self._prefetched.take(flat) if self._prefetched is not None else None
        finally:
            self._drop_prefetch()
        if taken is not None:
            unique, inverse, rows = taken
            self.stats["prefetched"] += 1
        else:
            unique, inverse = _unique_ids(flat)
            rows = torch.empty(len(unique), self.embedding_dim, dtype=torch.float32)
            self._session.sparse_pull(self.table, self.embedding_dim, unique.data_ptr(),
                                      len(unique), rows.data_ptr())
        self.stats["ids"] += flat.numel()
        self.stats["rows_pulled"] += len(unique)
        if torch.is_grad_enabled():
            rows.requires_grad_(True)
            self._pending.append((unique, rows))
        return rows[inverse].reshape(*ids.shape, self.embedding_dim).to(ids.device)

    def push(self, skipped=False):
        """This step's gradients of the rows used since the last push to the shards (every
        worker pushes every step, an empty one included; `skipped`: the step is skipped
        everywhere, nothing is applied)."""
        pairs = [] if skipped else [(u, r) for u, r in self._pending if r.grad is not None]
        self._pending = []
        if len(pairs) == 1:  # One forward since the last push: its ids are unique already.
            unique, summed = pairs[0][0], pairs[0][1].grad
        elif pairs:
            ids = torch.cat([u for u, _ in pairs])
            grads = torch.cat([r.grad for _, r in pairs])
            unique, inverse = _unique_ids(ids)
            summed = torch.zeros(len(unique), self.embedding_dim).index_add_(0, inverse, grads)
        else:
            unique = torch.zeros(0, dtype=torch.int64)
            summed = torch.zeros(0, self.embedding_dim)
        self._session.sparse_push(self.table, self.embedding_dim, self.steps, unique.data_ptr(),
                                  len(unique), summed.contiguous().data_ptr())
        self.stats["rows_pushed"] += len(unique)
        self.steps += 1
        if self._prefetched is not None and not self._prefetched.started():
            self._prefetched.start()  # The rows of the step just pushed (applied, with bsp).


class _Prefetch:
    """One SparseEmbedding.prefetch(): the unique ids, and their rows pulled by a thread
    (the session's sparse pull may run beside its other calls; ctypes lets go of the GIL
    while it waits). `step` is the table's push count when the pull started: the rows are
    used only while it is unchanged."""

    def __init__(self, table, flat):
        # A copy: `flat` may be a view of the caller's batch, which may change before forward.
        self.table, self.flat = table, flat.clone()
        self.unique, self.inverse = _unique_ids(flat)
        self.rows = torch.empty(len(self.unique), table.embedding_dim, dtype=torch.float32)
        self.thread, self.step, self.error = None, None, None

    def started(self):
        return self.thread is not None

    def start(self):
        t = self.table
        self.step = t.steps

        def pull():
            try:
                t._session.sparse_pull(t.table, t.embedding_dim, self.unique.data_ptr(),
                                       len(self.unique), self.rows.data_ptr())
            except BaseException as e:  # Any failure: the rows were not (all) written.
                self.error = e

        self.thread = threading.Thread(target=pull, name=f"prefetch {t.table}", daemon=True)
        self.thread.start()

    def join(self):
        if self.thread is not None:
            self.thread.join()

    def take(self, flat):
        """(unique ids, inverse, rows) if this pull is of `flat` and still current, else None;
        the pull's error, if it failed."""
        if (not self.started() or self.step != self.table.steps
                or not torch.equal(flat, self.flat)):
            return None
        self.join()
        if self.error is not None:
            raise self.error
        return self.unique, self.inverse, self.rows


class SparseEmbeddingBag(SparseEmbedding):
    """Drop-in for nn.EmbeddingBag (mode "sum" or "mean") over a SparseEmbedding's table:
    forward(input) with a 2-D input (bags of equal size, one per row) or forward(input,
    offsets) with a 1-D input and each bag's start."""

    def __init__(self, num_embeddings, embedding_dim, name, mode="mean", **kwargs):
        if mode not in ("sum", "mean"):
            raise DptrainError(f"SparseEmbeddingBag mode must be sum or mean, got {mode!r}")
        super().__init__(num_embeddings, embedding_dim, name, **kwargs)
        self.mode = mode

    def forward(self, input, offsets=None):
        rows = super().forward(input)
        if input.dim() == 2:
            if offsets is not None:
                raise DptrainError("SparseEmbeddingBag: offsets go with a 1-D input only")
            return rows.sum(dim=1) if self.mode == "sum" else rows.mean(dim=1)
        if input.dim() != 1 or offsets is None:
            raise DptrainError("SparseEmbeddingBag: a 1-D input needs offsets")
        offsets = offsets.to("cpu", torch.int64)
        ends = torch.cat([offsets[1:], torch.tensor([input.numel()])])
        lengths = ends - offsets
        if bool((lengths < 0).any()) or (offsets.numel() and int(offsets[0]) != 0):
            raise DptrainError("SparseEmbeddingBag: offsets must start at 0 and not decrease")
        bag = torch.repeat_interleave(torch.arange(len(offsets)), lengths)
        out = torch.zeros(len(offsets), self.embedding_dim, dtype=rows.dtype,
                          device=rows.device).index_add(0, bag.to(rows.device), rows)
        if self.mode == "mean":
            out = out / lengths.clamp(min=1).to(out.device, out.dtype).unsqueeze(1)
        return out
