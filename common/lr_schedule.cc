#include "common/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace dptrain {
namespace {

constexpr double kPi = 3.14159265358979323846;

absl::Status Invalid(const char* field, const char* requirement, double value) {
  return absl::InvalidArgumentError(
      absl::StrCat("lr schedule: ", field, " must be ", requirement, ", got ", value));
}

}  // namespace

absl::Status ValidateLrSchedule(const LrScheduleOptions& o) {
  if (o.name != "constant" && o.name != "step" && o.name != "cosine") {
    return absl::InvalidArgumentError(absl::StrCat("unknown lr schedule '", o.name,
                                                   "' (expected one of: constant, step, cosine)"));
  }
  if (!std::isfinite(o.base_lr) || o.base_lr < 0) {
    return Invalid("base_lr", "finite and >= 0", o.base_lr);
  }
  if (!std::isfinite(o.scale) || !(o.scale > 0)) return Invalid("scale", "finite and > 0", o.scale);
  if (o.warmup_steps < 0) return Invalid("warmup_steps", ">= 0", o.warmup_steps);
  if (o.name == "step") {
    if (o.step_size < 1) return Invalid("step_size", ">= 1 for step", o.step_size);
    if (!std::isfinite(o.gamma) || !(o.gamma > 0)) {
      return Invalid("gamma", "finite and > 0 for step", o.gamma);
    }
  }
  if (o.name == "cosine") {
    if (o.total_steps <= o.warmup_steps) {
      return absl::InvalidArgumentError(
          absl::StrCat("lr schedule: total_steps must be > warmup_steps (", o.warmup_steps,
                       ") for cosine, got ", o.total_steps));
    }
    if (!std::isfinite(o.min_lr) || o.min_lr < 0) {
      return Invalid("min_lr", "finite and >= 0", o.min_lr);
    }
    if (o.min_lr > o.base_lr * o.scale) {
      return Invalid("min_lr", "<= base_lr * scale for cosine", o.min_lr);
    }
  }
  return absl::OkStatus();
}

float LearningRateAt(const LrScheduleOptions& o, int64_t step) {
  step = std::max<int64_t>(step, 0);
  const double target = o.base_lr * o.scale;
  if (step < o.warmup_steps) {
    return static_cast<float>(target * static_cast<double>(step + 1) / o.warmup_steps);
  }
  const int64_t s = step - o.warmup_steps;
  double lr = target;
  if (o.name == "step") {
    lr = target * std::pow(o.gamma, static_cast<double>(s / o.step_size));
  } else if (o.name == "cosine") {
    const int64_t period = o.total_steps - o.warmup_steps;
    lr = s >= period ? o.min_lr
                     : o.min_lr + (target - o.min_lr) *
                                      (1 + std::cos(kPi * static_cast<double>(s) / period)) / 2;
  }
  return static_cast<float>(lr);
}

}  // namespace dptrain
