"""Detects a local CUDA toolkit and exposes it as @local_cuda.

@local_cuda//:defs.bzl defines CUDA_AVAILABLE; @local_cuda//:cudart (and cublas, cudnn,
nccl) wrap the toolkit's libraries. Where no toolkit is found, the targets exist but are
empty and CUDA_AVAILABLE is False, so the tree builds CPU-only. CUDA_PATH overrides the
default /usr/local/cuda.
"""

_BUILD_WITH_CUDA = """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "headers",
    hdrs = glob(["include/**"]),
    includes = ["include"],
)

[cc_library(
    name = lib,
    linkopts = ["-L{path}/lib64", "-Wl,-rpath,{path}/lib64"] + ["-l" + l for l in libs],
    deps = [":headers"],
) for lib, libs in [
    ("cudart", ["cudart"]),
    ("cublas", ["cublas", "cublasLt"]),
    ("cudnn", ["cudnn"]),
    ("nccl", ["nccl"]),
]]
"""

_BUILD_WITHOUT_CUDA = """
package(default_visibility = ["//visibility:public"])

[cc_library(name = lib) for lib in ["headers", "cudart", "cublas", "cudnn", "nccl"]]
"""

def _cuda_configure_impl(ctx):
    path = ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    available = ctx.path(path + "/bin/nvcc").exists and ctx.path(path + "/include/cuda_runtime.h").exists
    if available:
        ctx.symlink(path + "/include", "include")
        ctx.file("BUILD", _BUILD_WITH_CUDA.replace("{path}", path))
    else:
        ctx.file("BUILD", _BUILD_WITHOUT_CUDA)
    ctx.file("defs.bzl", "CUDA_AVAILABLE = %s\nCUDA_PATH = %r\n" % (available, path))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_PATH"],
    local = True,
)
