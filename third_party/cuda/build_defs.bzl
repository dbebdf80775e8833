"""if_cuda(): choose build content by whether CUDA is available and not disabled."""

load("@local_cuda//:defs.bzl", "CUDA_AVAILABLE")

def if_cuda(if_true, if_false = []):
    """Returns if_true when building with CUDA, if_false otherwise.

    CUDA is used when the toolkit was detected and --config=nocuda was not given.
    """
    if not CUDA_AVAILABLE:
        return if_false
    return select({
        "//third_party/cuda:no_cuda": if_false,
        "//conditions:default": if_true,
    })
