// Dynamic loss scaling for mixed-precision training, with the semantics of PyTorch's
// torch.cuda.amp.GradScaler: the loss is multiplied by scale() before backward; after each
// step, Update(found_inf) halves the scale and skips the step if any gradient was inf/NaN,
// and doubles it after `growth_interval` finite steps in a row. In data-parallel training
// `found_inf` must be the global decision (GradientSync::SetOverflow / last_step_skipped):
// then every replica keeps the same scale.
#ifndef DPTRAIN_COMMON_LOSS_SCALER_H_
#define DPTRAIN_COMMON_LOSS_SCALER_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace dptrain {

struct LossScalerOptions {
  float initial_scale = 65536.0f;  // 2^16
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  int growth_interval = 2000;
};

class LossScaler {
 public:
  // InvalidArgument unless initial_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and
  // growth_interval >= 1.
  static absl::StatusOr<LossScaler> Create(const LossScalerOptions& options);

  float scale() const { return scale_; }
  // Finite steps since the last change of scale.
  int growth_tracker() const { return growth_tracker_; }

  // Records a step's outcome; returns true if the step is to be applied (no inf/NaN).
  bool Update(bool found_inf);

 private:
  explicit LossScaler(const LossScalerOptions& options)
      : options_(options), scale_(options.initial_scale) {}
  LossScalerOptions options_;
  float scale_;
  int growth_tracker_ = 0;
};

// True if any value is inf or NaN.
bool HasNonFinite(absl::Span<const float> values);

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_LOSS_SCALER_H_
