// The kernels of the any-shape nodes' twins (graph_kernels.h): the gather of the nodes that only
// move elements and its backward, the broadcast binary ops, Where, the reductions, TopK, the
// embedding lookups; each thread runs
// the per-element function of graph/element_sources.h, binary_elements.h or reduce_elements.h, the
// one element_sources_test checks on the host against the CPU nodes (and the CPU binary node
// computes with).
#include <cuda_runtime_api.h>

#include "worker/cuda/graph_kernels.h"
#include "worker/cuda/kernel_launch.h"
#include "worker/graph/binary_elements.h"
#include "worker/graph/element_sources.h"
#include "worker/graph/reduce_elements.h"

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

__global__ void BroadcastBinaryForwardKernel(int op, bool swapped, const float* x,
                                             const float* other, const int64_t* indices, float* y,
                                             int64_t n) {
  DPTRAIN_GRID_STRIDE(k, n) { y[k] = graph::BinaryValue(op, swapped, x[k], other[indices[k]]); }
}

__global__ void BroadcastBinaryBackwardFullKernel(int op, bool swapped, const float* x,
                                                  const float* other, const int64_t* indices,
                                                  const float* dy, float* dx, int64_t n) {
  DPTRAIN_GRID_STRIDE(k, n) {
    float gx, gc;
    graph::BinaryGrads(op, swapped, x[k], other[indices[k]], dy[k], gx, gc);
    dx[k] = gx;
  }
}

__global__ void BroadcastBinaryBackwardOperandKernel(int op, bool swapped, const float* x,
                                                     const float* other, const int64_t* offsets,
                                                     const int64_t* readers, const float* dy,
                                                     float* dother, int64_t m) {
  DPTRAIN_GRID_STRIDE(o, m) {
    dother[o] = graph::OperandGradSum(op, swapped, offsets, readers, x, other[o], dy, o);
  }
}

__global__ void ReduceForwardKernel(int reduction, const int64_t* offsets, const int64_t* readers,
                                    const float* x, float scale, float* y, int64_t* arg,
                                    int64_t m) {
  DPTRAIN_GRID_STRIDE(o, m) {
    int64_t taken = -1;
    y[o] = graph::ReducedValue(reduction, offsets, readers, x, scale, o, &taken);
    if (arg != nullptr) arg[o] = taken;
  }
}

__global__ void ReduceBackwardKernel(int reduction, const int64_t* out_of, const float* x,
                                     const float* y, const int64_t* arg, const float* dy,
                                     float scale, float* dx, int64_t n) {
  DPTRAIN_GRID_STRIDE(k, n) {
    dx[k] = graph::ReducedGrad(reduction, out_of, x, y, arg, dy, scale, k);
  }
}

__global__ void LookupForwardKernel(const float* table, const float* ids, int64_t row, float* y,
                                    int64_t n) {
  DPTRAIN_GRID_STRIDE(k, n) { y[k] = graph::LookedUp(table, ids, row, k); }
}

__global__ void LookupBackwardKernel(const int64_t* rows, const int64_t* offsets,
                                     const int64_t* readers, const float* dy, int64_t row,
                                     float* table_grad, int64_t n) {
  DPTRAIN_GRID_STRIDE(t, n) {
    const int64_t u = t / row, i = t % row;
    table_grad[rows[u] * row + i] = graph::LookupGradSum(offsets, readers, dy, row, u, i);
  }
}

__global__ void WhereForwardKernel(const float* cond, const float* a, const float* b, float* y,
                                   int64_t n) {
  DPTRAIN_GRID_STRIDE(k, n) { y[k] = cond[k] != 0.0f ? a[k] : b[k]; }
}

__global__ void WhereBackwardKernel(const float* cond, const float* dy, float* da, float* db,
                                    int64_t n) {
  DPTRAIN_GRID_STRIDE(k, n) {
    const bool taken = cond[k] != 0.0f;
    if (da != nullptr) da[k] = taken ? dy[k] : 0.0f;
    if (db != nullptr) db[k] = taken ? 0.0f : dy[k];
  }
}

__global__ void TopKForwardKernel(const float* x, float* y, int64_t* taken, int64_t outer,
                                  int64_t n, int64_t inner, int64_t k, bool largest) {
  DPTRAIN_GRID_STRIDE(r, outer * inner) {  // One row per thread.
    const int64_t o = r / inner, i = r % inner;
    const float* row = x + o * n * inner + i;
    int64_t prev = -1;
    for (int64_t j = 0; j < k; ++j) {
      prev = graph::TopKNext(row, n, inner, largest, prev);
      const int64_t at = (o * k + j) * inner + i;
      y[at] = row[prev * inner];
      taken[at] = (o * n + prev) * inner + i;
    }
  }
}

__global__ void ScatterTakenKernel(const float* dy, const int64_t* taken, float* dx, int64_t m) {
  DPTRAIN_GRID_STRIDE(j, m) { dx[taken[j]] = dy[j]; }  // Distinct: one row's picks differ.
}

}  // namespace

absl::Status TopKForward(const float* x, float* y, int64_t* taken, int64_t outer, int64_t n,
                         int64_t inner, int64_t k, bool largest, cudaStream_t stream) {
  const int64_t rows = outer * inner;
  if (rows == 0 || k == 0) return absl::OkStatus();
  TopKForwardKernel<<<Blocks(rows), kThreads, 0, stream>>>(x, y, taken, outer, n, inner, k,
                                                           largest);
  return Launched("TopKForwardKernel<<<>>>");
}

absl::Status TopKBackward(const float* dy, const int64_t* taken, float* dx, int64_t m, int64_t size,
                          cudaStream_t stream) {
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dx, 0, size * sizeof(float), stream));
  if (m == 0) return absl::OkStatus();
  ScatterTakenKernel<<<Blocks(m), kThreads, 0, stream>>>(dy, taken, dx, m);
  return Launched("ScatterTakenKernel<<<>>>");
}

absl::Status WhereForward(const float* cond, const float* a, const float* b, float* y, int64_t n,
                          cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  WhereForwardKernel<<<Blocks(n), kThreads, 0, stream>>>(cond, a, b, y, n);
  return Launched("WhereForwardKernel<<<>>>");
}

absl::Status WhereBackward(const float* cond, const float* dy, float* da, float* db, int64_t n,
                           cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  WhereBackwardKernel<<<Blocks(n), kThreads, 0, stream>>>(cond, dy, da, db, n);
  return Launched("WhereBackwardKernel<<<>>>");
}

absl::Status LookupForward(const float* table, const float* ids, int64_t row, float* y, int64_t n,
                           cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  LookupForwardKernel<<<Blocks(n), kThreads, 0, stream>>>(table, ids, row, y, n);
  return Launched("LookupForwardKernel<<<>>>");
}

absl::Status LookupBackward(const int64_t* rows, const int64_t* offsets, const int64_t* readers,
                            int64_t distinct, const float* dy, int64_t row, float* table_grad,
                            cudaStream_t stream) {
  const int64_t n = distinct * row;
  if (n == 0) return absl::OkStatus();
  LookupBackwardKernel<<<Blocks(n), kThreads, 0, stream>>>(rows, offsets, readers, dy, row,
                                                           table_grad, n);
  return Launched("LookupBackwardKernel<<<>>>");
}

absl::Status ReduceForward(int reduction, const int64_t* offsets, const int64_t* readers,
                           const float* x, float scale, float* y, int64_t* arg, int64_t m,
                           cudaStream_t stream) {
  if (m == 0) return absl::OkStatus();
  ReduceForwardKernel<<<Blocks(m), kThreads, 0, stream>>>(reduction, offsets, readers, x, scale, y,
                                                          arg, m);
  return Launched("ReduceForwardKernel<<<>>>");
}

absl::Status ReduceBackward(int reduction, const int64_t* out_of, const float* x, const float* y,
                            const int64_t* arg, const float* dy, float scale, float* dx, int64_t n,
                            cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  ReduceBackwardKernel<<<Blocks(n), kThreads, 0, stream>>>(reduction, out_of, x, y, arg, dy, scale,
                                                           dx, n);
  return Launched("ReduceBackwardKernel<<<>>>");
}

absl::Status BroadcastBinaryForward(int op, bool swapped, const float* x, const float* other,
                                    const int64_t* indices, float* y, int64_t n,
                                    cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  BroadcastBinaryForwardKernel<<<Blocks(n), kThreads, 0, stream>>>(op, swapped, x, other, indices,
                                                                   y, n);
  return Launched("BroadcastBinaryForwardKernel<<<>>>");
}

absl::Status BroadcastBinaryBackwardFull(int op, bool swapped, const float* x, const float* other,
                                         const int64_t* indices, const float* dy, float* dx,
                                         int64_t n, cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  BroadcastBinaryBackwardFullKernel<<<Blocks(n), kThreads, 0, stream>>>(op, swapped, x, other,
                                                                        indices, dy, dx, n);
  return Launched("BroadcastBinaryBackwardFullKernel<<<>>>");
}

absl::Status BroadcastBinaryBackwardOperand(int op, bool swapped, const float* x,
                                            const float* other, const int64_t* offsets,
                                            const int64_t* readers, const float* dy, float* dother,
                                            int64_t m, cudaStream_t stream) {
  if (m == 0) return absl::OkStatus();
  BroadcastBinaryBackwardOperandKernel<<<Blocks(m), kThreads, 0, stream>>>(
      op, swapped, x, other, offsets, readers, dy, dother, m);
  return Launched("BroadcastBinaryBackwardOperandKernel<<<>>>");
}

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
