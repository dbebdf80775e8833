"""ctypes binding of libdptrain_c.so (python/native/dptrain_c.h): plain C types across the
boundary, errors as codes plus a message, no libtorch and no libpython linked, so one build
serves every Python and PyTorch version.

The library is found, in order, at $DPTRAIN_NATIVE_LIB, next to this file, or in a built
checkout's bazel-bin/python/native/ (tools/python_env.sh prints the exports)."""

import ctypes
import json
import os

ABI_VERSION = 4

# absl::StatusCode names, for messages.
_CODES = {1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
          5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
          9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED",
          13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED"}


class DptrainError(RuntimeError):
    """A failure of dptrain's native side (or of its use), with the status code's name."""

    __module__ = "dptrain"

    def __init__(self, message, code=None):
        super().__init__(message)
        self.code = _CODES.get(code, code)


def _candidates():
    here = os.path.dirname(os.path.abspath(__file__))
    env = os.environ.get("DPTRAIN_NATIVE_LIB")
    if env:
        return [env]
    return [os.path.join(here, "libdptrain_c.so"),
            os.path.join(here, "..", "..", "bazel-bin", "python", "native", "libdptrain_c.so")]


_lib = None


def lib():
    """The loaded library (loaded on first use); DptrainError if it cannot be found."""
    global _lib
    if _lib is not None:
        return _lib
    tried = _candidates()
    path = next((p for p in tried if os.path.exists(p)), None)
    if path is None:
        raise DptrainError("dptrain's native library is not built or not found (tried "
                           + ", ".join(tried) + "): run bazel build //python/native:"
                           "libdptrain_c.so and eval \"$(tools/python_env.sh)\"")
    handle = ctypes.CDLL(path)
    f32p, i64p, intp = (ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_int64),
                        ctypes.POINTER(ctypes.c_int))
    session = ctypes.c_void_p
    signatures = {
        "dpt_abi_version": ([], ctypes.c_int),
        "dpt_last_error": ([], ctypes.c_char_p),
        "dpt_create": ([ctypes.c_char_p, ctypes.POINTER(session)], ctypes.c_int),
        "dpt_destroy": ([session], None),
        "dpt_rank": ([session], ctypes.c_int),
        "dpt_world_size": ([session], ctypes.c_int),
        "dpt_master_port": ([session], ctypes.c_int),
        "dpt_broadcast": ([session, f32p, ctypes.c_int64, ctypes.c_int], ctypes.c_int),
        "dpt_allreduce": ([session, f32p, ctypes.c_int64, ctypes.c_int], ctypes.c_int),
        "dpt_allreduce_gradient": ([session, f32p, ctypes.c_int64], ctypes.c_int),
        "dpt_check_same": ([session, ctypes.c_char_p, ctypes.c_char_p], ctypes.c_int),
        "dpt_register_gradients": ([session, ctypes.c_char_p, i64p, ctypes.c_int64],
                                   ctypes.c_int),
        "dpt_reduce_gradients": ([session, f32p, ctypes.c_int64, intp], ctypes.c_int),
        "dpt_reduce_begin": ([session, f32p, ctypes.c_int64], ctypes.c_int),
        "dpt_reduce_ready": ([session, ctypes.c_int64], ctypes.c_int),
        "dpt_reduce_cancel": ([session], ctypes.c_int),
        "dpt_reduce_end": ([session, intp], ctypes.c_int),
        "dpt_start_server": ([session, ctypes.c_char_p, i64p, ctypes.c_int64, f32p,
                              ctypes.c_int64, i64p], ctypes.c_int),
        "dpt_push_pull": ([session, ctypes.c_int64, f32p, f32p, ctypes.c_int64, intp, i64p],
                          ctypes.c_int),
        "dpt_sparse_declare": ([session, ctypes.c_char_p, i64p], ctypes.c_int),
        "dpt_sparse_pull": ([session, ctypes.c_char_p, ctypes.c_int, i64p, ctypes.c_int64,
                             f32p], ctypes.c_int),
        "dpt_sparse_push": ([session, ctypes.c_char_p, ctypes.c_int, ctypes.c_int64, i64p,
                             ctypes.c_int64, f32p], ctypes.c_int),
        "dpt_sparse_step": ([session, ctypes.c_char_p, i64p], ctypes.c_int),
        "dpt_sparse_rollback": ([session, ctypes.c_char_p, ctypes.c_int64], ctypes.c_int),
        "dpt_rewind": ([session, ctypes.c_int64, f32p, ctypes.c_int64], ctypes.c_int),
        "dpt_sparse_initial_rows": ([ctypes.c_uint64, ctypes.c_char_p, i64p, ctypes.c_int64,
                                     ctypes.c_int, f32p], ctypes.c_int),
    }
    for name, (args, result) in signatures.items():
        fn = getattr(handle, name)
        fn.argtypes = args
        fn.restype = result
    if handle.dpt_abi_version() != ABI_VERSION:
        raise DptrainError(f"{path} has ABI version {handle.dpt_abi_version()}, this package "
                           f"needs {ABI_VERSION}: rebuild it")
    _lib = handle
    return _lib


def check(code):
    """Raises DptrainError with the native message if `code` is not 0."""
    if code != 0:
        raise DptrainError(lib().dpt_last_error().decode("utf-8", "replace"), code)


def floats(address):
    """A float* for ctypes from a raw address (a tensor's data_ptr())."""
    return ctypes.cast(ctypes.c_void_p(address), ctypes.POINTER(ctypes.c_float))


def int64s(address):
    """An int64_t* for ctypes from a raw address."""
    return ctypes.cast(ctypes.c_void_p(address), ctypes.POINTER(ctypes.c_int64))


def initial_rows(seed, table, ids_address, n, dim, out_address):
    """Rows `ids` of a sparse table at its start (common/sparse_rows.h), no session needed."""
    check(lib().dpt_sparse_initial_rows(seed, table.encode(), int64s(ids_address), n, dim,
                                        floats(out_address)))


class Session:
    """One process's session (session.h). Every method but the getters is collective."""

    def __init__(self, options):
        self._handle = ctypes.c_void_p()
        check(lib().dpt_create(json.dumps(options).encode(), ctypes.byref(self._handle)))

    def close(self):
        if self._handle:
            lib().dpt_destroy(self._handle)
            self._handle = ctypes.c_void_p()

    def rank(self):
        return lib().dpt_rank(self._handle)

    def world_size(self):
        return lib().dpt_world_size(self._handle)

    def broadcast(self, address, n, root):
        check(lib().dpt_broadcast(self._handle, floats(address), n, root))

    def allreduce(self, address, n, average):
        check(lib().dpt_allreduce(self._handle, floats(address), n, 1 if average else 0))

    def allreduce_gradient(self, address, n):
        check(lib().dpt_allreduce_gradient(self._handle, floats(address), n))

    def check_same(self, what, description):
        check(lib().dpt_check_same(self._handle, what.encode(), description.encode()))

    @staticmethod
    def _tensors(names, sizes):
        for name in names:
            if "\n" in name:
                raise DptrainError(f"tensor name {name!r} holds a newline")
        return "\n".join(names).encode(), (ctypes.c_int64 * len(sizes))(*sizes)

    def register_gradients(self, names, sizes):
        joined, array = self._tensors(names, sizes)
        check(lib().dpt_register_gradients(self._handle, joined, array, len(sizes)))

    def reduce_gradients(self, address, n):
        skipped = ctypes.c_int(0)
        check(lib().dpt_reduce_gradients(self._handle, floats(address), n, ctypes.byref(skipped)))
        return bool(skipped.value)

    def reduce_begin(self, address, n):
        check(lib().dpt_reduce_begin(self._handle, floats(address), n))

    def reduce_ready(self, upto):
        check(lib().dpt_reduce_ready(self._handle, upto))

    def reduce_cancel(self):
        check(lib().dpt_reduce_cancel(self._handle))

    def reduce_end(self):
        skipped = ctypes.c_int(0)
        check(lib().dpt_reduce_end(self._handle, ctypes.byref(skipped)))
        return bool(skipped.value)

    def start_server(self, names, sizes, weights_address, n):
        joined, array = self._tensors(names, sizes)
        step = ctypes.c_int64(0)
        check(lib().dpt_start_server(self._handle, joined, array, len(sizes),
                                     floats(weights_address), n, ctypes.byref(step)))
        return step.value

    def sparse_declare(self, spec):
        step = ctypes.c_int64(0)
        check(lib().dpt_sparse_declare(self._handle, json.dumps(spec).encode(),
                                       ctypes.byref(step)))
        return step.value

    def sparse_pull(self, table, dim, ids_address, n, out_address):
        check(lib().dpt_sparse_pull(self._handle, table.encode(), dim, int64s(ids_address), n,
                                    floats(out_address)))

    def sparse_push(self, table, dim, step, ids_address, n, grads_address):
        check(lib().dpt_sparse_push(self._handle, table.encode(), dim, step, int64s(ids_address),
                                    n, floats(grads_address)))

    def sparse_step(self, table):
        step = ctypes.c_int64(0)
        check(lib().dpt_sparse_step(self._handle, table.encode(), ctypes.byref(step)))
        return step.value

    def sparse_rollback(self, table, step):
        check(lib().dpt_sparse_rollback(self._handle, table.encode(), step))

    def rewind(self, step, weights_address, n):
        check(lib().dpt_rewind(self._handle, step, floats(weights_address), n))

    def push_pull(self, step, gradient_address, weights_address, n):
        skipped, rewind = ctypes.c_int(0), ctypes.c_int64(-1)
        check(lib().dpt_push_pull(self._handle, step, floats(gradient_address),
                                  floats(weights_address), n, ctypes.byref(skipped),
                                  ctypes.byref(rewind)))
        return bool(skipped.value), rewind.value
