// Optimizers applied to an averaged gradient: by a parameter-server shard to its chunks, or
// by every replica itself in all-reduce mode.
// Optimizer state (momentum buffer, Adam's moments) lives beside the weights, one per chunk.
//
// The update rules are PyTorch's (torch.optim.SGD, Adam and AdamW, single-tensor path,
// no Nesterov, no amsgrad); common/optimizer_test.cc checks them against trajectories
// written by PyTorch itself (tools/make_optimizer_fixtures.py).
#ifndef DPTRAIN_COMMON_OPTIMIZER_H_
#define DPTRAIN_COMMON_OPTIMIZER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace dptrain {

struct OptimizerOptions {
  // "sgd", "adam", "adamw", or "none": the weights become the averaged gradient (a
  // parameter-server shard that only averages; the workers' optimizers apply it).
  std::string name = "sgd";
  // The rate of the Apply overload without one (a constant rate); the caller of a schedule
  // passes LearningRateAt(schedule, step) to Apply instead (common/lr_schedule.h).
  float learning_rate = 0.1f;
  float momentum = 0.0f;      // sgd only; adam and adamw ignore it.
  bool nesterov = false;      // sgd with momentum > 0 only (torch.optim.SGD's nesterov).
  float weight_decay = 0.0f;  // sgd, adam: L2 added to the gradient; adamw: decoupled.
  // adam and adamw only. Doubles, like the Python floats PyTorch takes: 1 - beta and the
  // bias corrections are computed in double before the float32 element loop.
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
};

// Per-chunk optimizer state. Owned by the shard (or the replica), next to the chunk's weights;
// the buffers are sized by the first Apply that needs them.
struct OptimizerState {
  std::vector<float> momentum_buffer;  // sgd: empty until the first step with momentum.
  std::vector<float> exp_avg;          // adam/adamw: first moment m.
  std::vector<float> exp_avg_sq;       // adam/adamw: second moment v.
  int64_t steps = 0;                   // Apply calls on this state (Adam's bias correction t).

  // The vectors above, in that order.
  std::array<std::vector<float>*, 3> vectors() { return {&momentum_buffer, &exp_avg, &exp_avg_sq}; }
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // One optimizer step on one chunk: weights -= update(gradient) at rate `learning_rate`.
  // `weights` and `gradient` have equal sizes, the same chunk on every call with `state`;
  // `learning_rate` is finite and >= 0 (LearningRateAt of a validated schedule is). Increments
  // state.steps. Not thread-safe for the same state; distinct states may be used concurrently.
  void Apply(absl::Span<float> weights, absl::Span<const float> gradient, OptimizerState& state,
             float learning_rate) const {
    Step(weights, gradient, state, learning_rate);
  }
  // The same at the constant rate options.learning_rate.
  void Apply(absl::Span<float> weights, absl::Span<const float> gradient,
             OptimizerState& state) const {
    Step(weights, gradient, state, options_.learning_rate);
  }

  const OptimizerOptions& options() const { return options_; }

 protected:
  explicit Optimizer(const OptimizerOptions& options) : options_(options) {}

 private:
  virtual void Step(absl::Span<float> weights, absl::Span<const float> gradient,
                    OptimizerState& state, float learning_rate) const = 0;

  const OptimizerOptions options_;
};

// The per-step scalars of Adam/AdamW at step t (1-based), computed in double and rounded to
// float once, like PyTorch's Python floats. Shared by the CPU loop and the CUDA kernel, so that
// both apply the same rounded numbers:
//   adamw: w *= decay (decay = 1 - lr * wd; 1 without decay)    adam: g += l2 * w (l2 = wd)
//   m = beta1 m + one_minus_beta1 g;   v = beta2 v + one_minus_beta2 g g
//   w -= step_size * m / (sqrt(v) / bias_correction2_sqrt + eps)
struct AdamScalars {
  float step_size, bias_correction2_sqrt, beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  float l2;     // adam's L2 coefficient (0 for adamw)
  float decay;  // adamw's decoupled decay factor (1 for adam)
};
// `options.name` is "adam" or "adamw".
AdamScalars AdamScalarsAt(const OptimizerOptions& options, int64_t t, float learning_rate);

// InvalidArgument, with one message naming the field, for: an unknown name (the message lists
// the valid ones); learning_rate, momentum or weight_decay negative or not finite; for adam and
// adamw also beta1 or beta2 outside [0, 1) and eps not finite or <= 0.
absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(const OptimizerOptions& options);

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_OPTIMIZER_H_
