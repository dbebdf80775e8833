// A tensor of the model that a graph twin reads (graph::OperandSource): a parameter or buffer
// bound by the graph, or the CPU node's held constant, copied to the device at the first
// Forward. Used by the binary ops' twins (gpu_graph_ops.cc, gpu_broadcast_binary.cc) and the
// moves' (gpu_movement_ops.cc).
#ifndef DPTRAIN_WORKER_CUDA_GRAPH_OPERAND_H_
#define DPTRAIN_WORKER_CUDA_GRAPH_OPERAND_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/device_context.h"
#include "worker/cuda/gpu_graph.h"
#include "worker/graph/node.h"

namespace dptrain {
namespace cuda {

// One operand of one node: where its values are, and its gradient if learned.
class GraphOperand {
 public:
  GraphOperand(graph::OperandSource source, const float* held, int64_t size)
      : source_(source), held_(held, held == nullptr ? held : held + size), size_(size) {}

  void BindParams(absl::Span<const float* const> params, absl::Span<float* const> grads) {
    if (source_ != graph::OperandSource::kParam) return;
    values_ = params[0];
    grad_ = grads[0];
  }
  void BindBuffers(absl::Span<float* const> buffers) {
    if (source_ == graph::OperandSource::kBuffer) values_ = buffers[0];
  }
  // Where the values lie on the device (uploading the held ones once).
  absl::StatusOr<const float*> Values(DeviceContext& ctx) {
    if (source_ != graph::OperandSource::kHeld) {
      if (values_ == nullptr) {
        return absl::FailedPreconditionError("a parameter or buffer operand was not bound");
      }
      return values_;
    }
    if (uploaded_ == nullptr) {
      DPTRAIN_ASSIGN_OR_RETURN(float* d, device_.Ensure(ctx, size_));
      DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d, held_.data(), size_ * sizeof(float),
                                                   cudaMemcpyHostToDevice, ctx.stream()));
      uploaded_ = d;
    }
    return uploaded_;
  }
  float* grad() const { return grad_; }  // Null unless a parameter.
  int64_t size() const { return size_; }

 private:
  const graph::OperandSource source_;
  const std::vector<float> held_;
  const int64_t size_;
  const float* values_ = nullptr;
  float* grad_ = nullptr;
  DeviceBuffer<float> device_;
  const float* uploaded_ = nullptr;
};

// A twin of an any-shape node that may read one tensor of the model (TwinSpec's operand fields,
// set where operand_size > 0): the operand, bound where the graph keeps it.
class OperandNodeTwin : public GpuNode {
 public:
  void BindParams(absl::Span<const float* const> params, absl::Span<float* const> grads) override {
    if (operand_) operand_->BindParams(params, grads);
  }
  void BindBuffers(absl::Span<float* const> buffers) override {
    if (operand_) operand_->BindBuffers(buffers);
  }

 protected:
  explicit OperandNodeTwin(const graph::TwinSpec<float>& spec) {
    if (spec.operand_size > 0) {
      operand_.emplace(spec.operand_source, spec.held_operand, spec.operand_size);
    }
  }

  std::optional<GraphOperand> operand_;  // Empty: the node reads no tensor of the model.
};

}  // namespace cuda
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_CUDA_GRAPH_OPERAND_H_
