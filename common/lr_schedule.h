// The learning rate as a pure function of the global step, so that every mode (parameter
// server, all-reduce, master) computes the same rate for the same step.
//
// Semantics (PyTorch's torch.optim.lr_scheduler, checked against it by
// common/lr_schedule_test.cc with fixtures from tools/make_optimizer_fixtures.py).
// `step` counts the optimizer steps taken before this one: the first update uses step 0.
// target = base_lr * scale (scale: e.g. the number of workers, Goyal et al.'s linear scaling).
//   Warmup, step < warmup_steps: a linear ramp that ends at the target and does not start at 0:
//     lr = target * (step + 1) / warmup_steps
//     (LambdaLR with lambda s: (s + 1) / warmup_steps; the last warmup step runs at target).
//   Then, with s = step - warmup_steps:
//     constant: lr = target
//     step:     lr = target * gamma^floor(s / step_size)             (StepLR)
//     cosine:   lr = min_lr + (target - min_lr) * (1 + cos(pi * s / T)) / 2, T = total_steps -
//               warmup_steps (CosineAnnealingLR(T_max = T, eta_min = min_lr)); for s >= T the
//               rate stays at min_lr (PyTorch would climb back up the cosine). min_lr is not
//               scaled.
#ifndef DPTRAIN_COMMON_LR_SCHEDULE_H_
#define DPTRAIN_COMMON_LR_SCHEDULE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace dptrain {

struct LrScheduleOptions {
  std::string name = "constant";  // "constant", "step" or "cosine".
  double base_lr = 0.1;
  int64_t warmup_steps = 0;  // 0: no warmup.
  int64_t step_size = 1;     // step: steps between two multiplications by gamma.
  double gamma = 0.1;        // step: the factor.
  int64_t total_steps = 0;   // cosine: warmup included; must exceed warmup_steps.
  double min_lr = 0.0;       // cosine: eta_min, reached at total_steps.
  double scale = 1.0;        // Multiplies base_lr (not min_lr).
};

// InvalidArgument, with one message naming the field, for: an unknown name (the message lists
// the valid ones); base_lr or min_lr negative or not finite; scale not finite or <= 0;
// warmup_steps < 0; for step: step_size < 1 or gamma not finite or <= 0; for cosine:
// total_steps <= warmup_steps or min_lr > base_lr * scale.
absl::Status ValidateLrSchedule(const LrScheduleOptions& options);

// The rate of the optimizer step `step` (0 for the first; a negative step counts as 0).
// `options` must have passed ValidateLrSchedule; the result is then finite and >= 0.
float LearningRateAt(const LrScheduleOptions& options, int64_t step);

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_LR_SCHEDULE_H_
