// Index tables made on the host and kept on the device, for the twins of the any-shape nodes
// (gpu_movement_ops.cc's MoveTwin, gpu_broadcast_binary.cc): per output element an index (a
// move's source, graph/element_sources.h; a broadcast operand's element), and per input the
// readers of each of its elements (graph::Readers), in increasing order. Made once per batch
// size (PlanCache) and uploaded synchronously (the host tables are freed after).
#ifndef DPTRAIN_WORKER_CUDA_INDEX_PLAN_H_
#define DPTRAIN_WORKER_CUDA_INDEX_PLAN_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/device_context.h"

namespace dptrain {
namespace cuda {

struct IndexPlan {
  int64_t outputs = 0;
  DeviceBuffer<int64_t> indices;  // `outputs` entries.
  struct Input {
    int64_t size = 0;
    DeviceBuffer<int64_t> offsets, readers;
  };
  std::vector<Input> inputs;  // Per input of `sizes`.
};

// The plan of `indices` over inputs of `sizes` elements; Internal if an index lies outside them
// (a bug of the node that made it).
absl::StatusOr<std::unique_ptr<IndexPlan>> MakeIndexPlan(DeviceContext& ctx,
                                                         const std::vector<int64_t>& indices,
                                                         const std::vector<int64_t>& sizes);

// Copies `host` to `device` (grown to fit) on the context's stream, after the work already
// queued there (the caching allocator may hand back a block that work still reads), and waits
// for the copy: `host` may change after.
template <typename T>
absl::Status UploadAndWait(DeviceContext& ctx, const std::vector<T>& host,
                           DeviceBuffer<T>& device) {
  if (host.empty()) return absl::OkStatus();
  absl::StatusOr<T*> to = device.Ensure(ctx, static_cast<int64_t>(host.size()));
  if (!to.ok()) return to.status();
  const absl::Status copy = CudaStatus(cudaMemcpyAsync(*to, host.data(), host.size() * sizeof(T),
                                                       cudaMemcpyHostToDevice, ctx.stream()),
                                       "cudaMemcpyAsync of an index plan");
  if (!copy.ok()) return copy;
  return ctx.Synchronize();
}

// The plans of one node, by batch size.
class PlanCache {
 public:
  // The plan for `batch`, or null: make it then (Put).
  IndexPlan* Find(int batch) const {
    auto it = plans_.find(batch);
    return it == plans_.end() ? nullptr : it->second.get();
  }
  IndexPlan* Put(int batch, std::unique_ptr<IndexPlan> plan) {
    return (plans_[batch] = std::move(plan)).get();
  }

 private:
  std::map<int, std::unique_ptr<IndexPlan>> plans_;
};

}  // namespace cuda
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_CUDA_INDEX_PLAN_H_
