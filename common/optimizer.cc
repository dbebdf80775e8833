#include "common/optimizer.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dptrain {
namespace {

// torch.optim.SGD semantics (dampening 0):
//   d = g + weight_decay * w;  buf = momentum * buf + d (buf = d at the first step);
//   w -= lr * buf  (or lr * d without momentum; lr * (d + momentum * buf) with nesterov).
class Sgd : public Optimizer {
 public:
  explicit Sgd(const OptimizerOptions& o) : Optimizer(o) {}

 private:
  void Step(absl::Span<float> w, absl::Span<const float> g, OptimizerState& state,
            float lr) const override {
    const float wd = options().weight_decay, mu = options().momentum;
    const bool nesterov = options().nesterov;
    const size_t n = w.size();
    if (mu == 0.0f) {
      for (size_t i = 0; i < n; ++i) w[i] -= lr * (g[i] + wd * w[i]);
    } else if (state.momentum_buffer.empty()) {
      state.momentum_buffer.resize(n);
      for (size_t i = 0; i < n; ++i) {
        const float d = g[i] + wd * w[i];
        state.momentum_buffer[i] = d;
        w[i] -= lr * (nesterov ? d + mu * d : d);
      }
    } else {
      float* buf = state.momentum_buffer.data();
      for (size_t i = 0; i < n; ++i) {
        const float d = g[i] + wd * w[i];
        buf[i] = mu * buf[i] + d;
        w[i] -= lr * (nesterov ? d + mu * buf[i] : buf[i]);
      }
    }
    ++state.steps;
  }
};

// torch.optim.Adam (decoupled = false) and torch.optim.AdamW (decoupled = true), amsgrad off:
//   t += 1
//   adamw: w *= 1 - lr * wd            adam: g += wd * w
//   m = beta1 * m + (1 - beta1) * g;   v = beta2 * v + (1 - beta2) * g * g   (m = v = 0 at t=0)
//   denom = sqrt(v) / sqrt(1 - beta2^t) + eps
//   w -= lr / (1 - beta1^t) * m / denom
// The scalars are computed in double and rounded to float once, like PyTorch's Python floats.
class Adam : public Optimizer {
 public:
  explicit Adam(const OptimizerOptions& o) : Optimizer(o) {}

 private:
  void Step(absl::Span<float> w, absl::Span<const float> g, OptimizerState& state,
            float lr) const override {
    const size_t n = w.size();
    if (state.exp_avg.size() != n) {
      state.exp_avg.assign(n, 0.0f);
      state.exp_avg_sq.assign(n, 0.0f);
    }
    const AdamScalars s = AdamScalarsAt(options(), ++state.steps, lr);
    if (s.decay != 1.0f) {
      for (size_t i = 0; i < n; ++i) w[i] *= s.decay;
    }
    float* m = state.exp_avg.data();
    float* v = state.exp_avg_sq.data();
    for (size_t i = 0; i < n; ++i) {
      const float grad = g[i] + s.l2 * w[i];
      m[i] = m[i] * s.beta1 + s.one_minus_beta1 * grad;
      v[i] = v[i] * s.beta2 + s.one_minus_beta2 * grad * grad;
      const float denom = std::sqrt(v[i]) / s.bias_correction2_sqrt + s.eps;
      w[i] -= s.step_size * m[i] / denom;
    }
  }
};

absl::Status CheckNonNegative(const char* field, double value) {
  if (!std::isfinite(value) || value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer: ", field, " must be finite and >= 0, got ", value));
  }
  return absl::OkStatus();
}

absl::Status CheckAdamOptions(const OptimizerOptions& o) {
  for (const auto& [field, beta] : {std::pair{"beta1", o.beta1}, std::pair{"beta2", o.beta2}}) {
    if (!(beta >= 0 && beta < 1)) {  // Also refuses NaN.
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer: ", field, " must be in [0, 1), got ", beta));
    }
  }
  if (!std::isfinite(o.eps) || !(o.eps > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer: eps must be finite and > 0 for ", o.name, ", got ", o.eps));
  }
  return absl::OkStatus();
}

}  // namespace

AdamScalars AdamScalarsAt(const OptimizerOptions& o, int64_t t, float lr) {
  const bool decoupled = o.name == "adamw";
  const double bias_correction1 = 1.0 - std::pow(o.beta1, static_cast<double>(t));
  const double bias_correction2 = 1.0 - std::pow(o.beta2, static_cast<double>(t));
  AdamScalars s;
  s.step_size = static_cast<float>(lr / bias_correction1);
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  s.beta1 = static_cast<float>(o.beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - o.beta1);
  s.beta2 = static_cast<float>(o.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
  s.eps = static_cast<float>(o.eps);
  s.l2 = decoupled ? 0.0f : o.weight_decay;
  s.decay = decoupled && o.weight_decay != 0.0f
                ? static_cast<float>(1.0 - static_cast<double>(lr) * o.weight_decay)
                : 1.0f;
  return s;
}

// "none": the weights become the averaged gradient itself. A parameter-server shard that
// only averages (ps_server --optimizer=none, BytePS's servers): the workers' own optimizers
// apply the average (dptrain.torch's DistributedOptimizer). Keeps no state.
class AverageOnly : public Optimizer {
 public:
  explicit AverageOnly(const OptimizerOptions& o) : Optimizer(o) {}

 private:
  void Step(absl::Span<float> w, absl::Span<const float> g, OptimizerState& state,
            float) const override {
    std::copy(g.begin(), g.end(), w.begin());
    ++state.steps;
  }
};

absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(const OptimizerOptions& options) {
  if (auto s = CheckNonNegative("learning_rate", options.learning_rate); !s.ok()) return s;
  if (auto s = CheckNonNegative("momentum", options.momentum); !s.ok()) return s;
  if (auto s = CheckNonNegative("weight_decay", options.weight_decay); !s.ok()) return s;
  if (options.nesterov && (options.name != "sgd" || !(options.momentum > 0))) {
    return absl::InvalidArgumentError(
        "nesterov needs sgd with a momentum > 0 (as torch.optim.SGD)");
  }
  if (options.name == "sgd") return std::make_unique<Sgd>(options);
  if (options.name == "none") return std::make_unique<AverageOnly>(options);
  if (options.name == "adam" || options.name == "adamw") {
    if (auto s = CheckAdamOptions(options); !s.ok()) return s;
    return std::make_unique<Adam>(options);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown optimizer '", options.name,
                                                 "' (expected one of: sgd, adam, adamw, none)"));
}

}  // namespace dptrain
