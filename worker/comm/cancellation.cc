#include "worker/comm/cancellation.h"

#include <utility>

namespace dptrain {

// The callbacks run under mu_, so that Deregister (from a call's destructor) waits for a
// Cancel running them on another thread.
CancellationManager::Token CancellationManager::Register(std::function<void()> cancel) {
  absl::MutexLock lock(&mu_);
  const Token token = next_++;
  if (cancelled_) {
    cancel();
  } else {
    callbacks_.emplace(token, std::move(cancel));
  }
  return token;
}

void CancellationManager::Deregister(Token token) {
  absl::MutexLock lock(&mu_);
  callbacks_.erase(token);
}

void CancellationManager::Cancel(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return;
  cancelled_ = true;
  why_ = why;
  for (auto& [token, cancel] : callbacks_) cancel();
  callbacks_.clear();
}

bool CancellationManager::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

absl::Status CancellationManager::why() const {
  absl::MutexLock lock(&mu_);
  return why_;
}

}  // namespace dptrain
