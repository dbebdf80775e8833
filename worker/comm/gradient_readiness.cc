#include "worker/comm/gradient_readiness.h"

#include <utility>

namespace dptrain {

void GradientReadiness::Advance(int64_t upto) {
  absl::MutexLock lock(&mu_);
  if (upto <= ready_.load(std::memory_order_relaxed)) return;
  ready_.store(upto, std::memory_order_release);
  for (auto& [id, wake] : wakes_) wake();
}

void GradientReadiness::Cancel() {
  absl::MutexLock lock(&mu_);
  if (cancelled_.exchange(true)) return;
  for (auto& [id, wake] : wakes_) wake();
}

bool GradientReadiness::WaitFor(int64_t upto, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto done = [this, upto]() {
    return cancelled() || ready_.load(std::memory_order_acquire) >= upto;
  };
  return mu_.AwaitWithDeadline(absl::Condition(&done), deadline) && !cancelled();
}

int GradientReadiness::Subscribe(std::function<void()> wake) {
  absl::MutexLock lock(&mu_);
  const int id = next_id_++;
  wakes_.emplace(id, std::move(wake));
  return id;
}

void GradientReadiness::Unsubscribe(int id) {
  absl::MutexLock lock(&mu_);  // A running wake holds it: this returns after it.
  wakes_.erase(id);
}

}  // namespace dptrain
