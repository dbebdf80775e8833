// Optimizers applied to an averaged gradient: by a parameter-server shard to its chunks, or
// by every replica itself in all-reduce mode.
// Optimizer state (e.g. the momentum buffer) lives beside the weights, one per chunk.
#ifndef DPTRAIN_COMMON_OPTIMIZER_H_
#define DPTRAIN_COMMON_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace dptrain {

struct OptimizerOptions {
  std::string name = "sgd";  // Only "sgd" for now (with momentum and weight decay).
  float learning_rate = 0.1f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
};

// Per-chunk optimizer state. Owned by the shard, next to the chunk's weights.
struct OptimizerState {
  std::vector<float> momentum_buffer;  // Empty until the first step with momentum.
  int64_t steps = 0;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // weights -= update(gradient). `weights` and `gradient` have equal sizes; `state`
  // belongs to this chunk. Not thread-safe for the same state.
  virtual void Apply(absl::Span<float> weights, absl::Span<const float> gradient,
                     OptimizerState& state) const = 0;
};

// InvalidArgument for an unknown name or a negative/non-finite hyper-parameter.
absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(const OptimizerOptions& options);

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_OPTIMIZER_H_
