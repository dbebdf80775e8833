// How much of a step's gradient is final, for a push that starts while backward still runs
// (dptrain.torch in ps and master mode): backward produces the last layers' gradients first,
// which lie first in the flat buffer, so "elements [0, ready()) are final" says it all. The
// frames of a tensor stream leave as soon as their chunk is ready (ShardStepCall); the
// training thread advances the mark as buckets complete.
#ifndef DPTRAIN_WORKER_COMM_GRADIENT_READINESS_H_
#define DPTRAIN_WORKER_COMM_GRADIENT_READINESS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace dptrain {

class GradientReadiness {
 public:
  // Nothing ready yet.
  GradientReadiness() = default;
  GradientReadiness(const GradientReadiness&) = delete;
  GradientReadiness& operator=(const GradientReadiness&) = delete;

  // Elements [0, upto) are final (a smaller `upto` than before changes nothing). Wakes the
  // subscribers, on this thread.
  void Advance(int64_t upto);
  int64_t ready() const { return ready_.load(std::memory_order_acquire); }
  // The step will not complete (backward failed): wakes the subscribers and waiters, which
  // give up (cancelled() is true from now on).
  void Cancel();
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  // Waits until ready() >= upto; false at the deadline or once cancelled.
  bool WaitFor(int64_t upto, absl::Time deadline);

  // `wake` runs on Advance's thread after each advance until Unsubscribe(id) returns (which
  // waits for a running `wake`). It must not call Subscribe or Unsubscribe.
  int Subscribe(std::function<void()> wake);
  void Unsubscribe(int id);

 private:
  std::atomic<int64_t> ready_{0};
  std::atomic<bool> cancelled_{false};
  absl::Mutex mu_;
  std::map<int, std::function<void()>> wakes_ ABSL_GUARDED_BY(mu_);
  int next_id_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_COMM_GRADIENT_READINESS_H_
