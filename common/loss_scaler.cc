#include "common/loss_scaler.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace dptrain {

absl::StatusOr<LossScaler> LossScaler::Create(const LossScalerOptions& o) {
  if (!(o.initial_scale > 0) || !std::isfinite(o.initial_scale) || !(o.growth_factor > 1) ||
      !(o.backoff_factor > 0 && o.backoff_factor < 1) || o.growth_interval < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss scaler: need initial_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and "
        "growth_interval >= 1; got ",
        o.initial_scale, ", ", o.growth_factor, ", ", o.backoff_factor, ", ",
        o.growth_interval));
  }
  return LossScaler(o);
}

bool LossScaler::Update(bool found_inf) {
  if (found_inf) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
    return false;
  }
  if (++growth_tracker_ == options_.growth_interval) {
    // GradScaler keeps the old scale if growing it would overflow fp32.
    const float grown = scale_ * options_.growth_factor;
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  }
  return true;
}

bool HasNonFinite(absl::Span<const float> values) {
  // inf/NaN are the values whose exponent bits are all ones. An integer OR-reduction
  // vectorises (a float sum would be one serial chain of adds without -ffast-math).
  uint32_t any = 0;
  for (float x : values) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof(bits));
    any |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return any != 0;
}

}  // namespace dptrain
