"""cuda_library: .cu files compiled by the toolkit's nvcc into a cc_library.

Only used behind if_cuda() (third_party/cuda/build_defs.bzl), so CPU-only machines never
run nvcc. Code is generated for the A100 (sm_80) and H100/H200 (sm_90), plus PTX of sm_90
for newer GPUs. nvcc is called by absolute path and is not tracked as an input:
`bazel clean` after upgrading the toolkit.
"""

load("@local_cuda//:defs.bzl", "CUDA_AVAILABLE", "CUDA_PATH")

_GENCODE = ("-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 " +
            "-gencode arch=compute_90,code=compute_90")

def cuda_library(name, srcs, hdrs = [], deps = [], nvcc_hdrs = [], **kwargs):
    """nvcc_hdrs: headers of other packages that the .cu files include (nvcc sees only these
    and hdrs, plus system headers)."""
    objects = []
    for src in srcs:
        obj = name + "_" + src.replace("/", "_").replace(".cu", ".pic.o")
        native.genrule(
            name = obj + "_nvcc",
            srcs = [src] + hdrs + nvcc_hdrs,
            outs = [obj],
            # 2810: nvcc flags `status = Call(...)` as a discarded [[nodiscard]] absl::Status
            # (operator= returns a reference); gcc rightly does not. ~50 lines of noise.
            cmd = ("%s/bin/nvcc -c -O3 -std=c++17 -Xcompiler -fPIC -diag-suppress=2810 %s " +
                   "-I. -I$(GENDIR) -o $@ $(location %s)") % (CUDA_PATH, _GENCODE, src),
        )
        objects.append(obj)
    native.cc_library(
        name = name,
        srcs = objects,
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cudart"],
        alwayslink = True,
        **kwargs
    )

def gpu_test(name, srcs, deps, size = "small", **kwargs):
    """A gtest that needs a GPU: tagged "gpu", it skips visibly where there is none.

    Defined only where the toolkit was detected (its deps are CUDA targets).
    """
    if not CUDA_AVAILABLE:
        return
    native.cc_test(
        name = name,
        size = size,
        srcs = srcs,
        tags = ["gpu"],
        deps = deps + ["//third_party:gtest_main"],
        **kwargs
    )
