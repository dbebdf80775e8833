// The gather of the nodes that only move elements and its backward (graph_kernels.h): each
// thread runs graph/element_sources.h's per-element function, the one element_sources_test
// checks on the host against the CPU nodes.
#include <cuda_runtime_api.h>

#include "worker/cuda/graph_kernels.h"
#include "worker/cuda/kernel_launch.h"
#include "worker/graph/element_sources.h"

namespace dptrain {
namespace cuda {
namespace {

static_assert(sizeof(SourceInputs::data) / sizeof(SourceInputs::data[0]) == graph::kMaxSourceInputs,
              "one pointer per runtime input a moving node may read");

__global__ void GatherSourcesKernel(const int64_t* sources, SourceInputs inputs, float* y,
                                    int64_t n) {
  DPTRAIN_GRID_STRIDE(k, n) { y[k] = graph::MovedElement(sources, inputs.data, k); }
}

__global__ void SumReadersKernel(const int64_t* offsets, const int64_t* readers, const float* dy,
                                 float* dx, int64_t m) {
  DPTRAIN_GRID_STRIDE(e, m) { dx[e] = graph::ReadersSum(offsets, readers, dy, e); }
}

}  // namespace

absl::Status GatherSources(const int64_t* sources, const SourceInputs& inputs, float* y, int64_t n,
                           cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  GatherSourcesKernel<<<Blocks(n), kThreads, 0, stream>>>(sources, inputs, y, n);
  return Launched("GatherSourcesKernel<<<>>>");
}

absl::Status SumReaders(const int64_t* offsets, const int64_t* readers, const float* dy, float* dx,
                        int64_t m, cudaStream_t stream) {
  if (m == 0) return absl::OkStatus();
  SumReadersKernel<<<Blocks(m), kThreads, 0, stream>>>(offsets, readers, dy, dx, m);
  return Launched("SumReadersKernel<<<>>>");
}

}  // namespace cuda
}  // namespace dptrain
