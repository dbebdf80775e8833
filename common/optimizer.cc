#include "common/optimizer.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dptrain {
namespace {

// torch.optim.SGD semantics (dampening 0, no Nesterov):
//   d = g + weight_decay * w;  buf = momentum * buf + d (buf = d at the first step);
//   w -= lr * buf  (or lr * d without momentum).
class Sgd : public Optimizer {
 public:
  explicit Sgd(const OptimizerOptions& o) : options_(o) {}

  void Apply(absl::Span<float> w, absl::Span<const float> g,
             OptimizerState& state) const override {
    const float lr = options_.learning_rate, wd = options_.weight_decay,
                mu = options_.momentum;
    const size_t n = w.size();
    if (mu == 0.0f) {
      for (size_t i = 0; i < n; ++i) w[i] -= lr * (g[i] + wd * w[i]);
    } else if (state.momentum_buffer.empty()) {
      state.momentum_buffer.resize(n);
      for (size_t i = 0; i < n; ++i) {
        const float d = g[i] + wd * w[i];
        state.momentum_buffer[i] = d;
        w[i] -= lr * d;
      }
    } else {
      float* buf = state.momentum_buffer.data();
      for (size_t i = 0; i < n; ++i) {
        buf[i] = mu * buf[i] + (g[i] + wd * w[i]);
        w[i] -= lr * buf[i];
      }
    }
    ++state.steps;
  }

 private:
  OptimizerOptions options_;
};

absl::Status CheckHyperParameter(const char* name, float value) {
  if (!std::isfinite(value) || value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer: ", name, " must be finite and >= 0, got ", value));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(const OptimizerOptions& options) {
  if (auto s = CheckHyperParameter("learning rate", options.learning_rate); !s.ok()) return s;
  if (auto s = CheckHyperParameter("momentum", options.momentum); !s.ok()) return s;
  if (auto s = CheckHyperParameter("weight decay", options.weight_decay); !s.ok()) return s;
  if (options.name == "sgd") return std::make_unique<Sgd>(options);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown optimizer '", options.name, "' (expected: sgd)"));
}

}  // namespace dptrain
