// Cancels a set of calls at once (TensorFlow's CancellationManager, reduced): the calls of
// one step to every shard register how to cancel themselves, and the first that fails
// cancels the rest. A step must not wait on one shard once another has failed it: the shard
// still waiting may be waiting for a rank that itself waits on this one (after a shard
// restart, rank 0 redoing step t on shard 1 while rank 1, a step ahead, waits for rank 0's
// step t+1 on shard 0), and only recovery, which needs every call ended, gets them out.
#ifndef DPTRAIN_WORKER_COMM_CANCELLATION_H_
#define DPTRAIN_WORKER_COMM_CANCELLATION_H_

#include <cstdint>
#include <functional>
#include <map>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace dptrain {

class CancellationManager {
 public:
  using Token = int64_t;

  // Registers `cancel`, to run once when Cancel is first called; if it was called already,
  // runs it at once. The token deregisters it. `cancel` must not call this manager.
  Token Register(std::function<void()> cancel);
  // After this returns, the callback of `token` neither runs nor is running.
  void Deregister(Token token);
  // The first call records `why` (a failure; ignored if OK) and runs every callback;
  // later calls do nothing.
  void Cancel(const absl::Status& why);
  bool cancelled() const;
  // The first failure given to Cancel (OK before).
  absl::Status why() const;

 private:
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status why_ ABSL_GUARDED_BY(mu_);
  Token next_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<Token, std::function<void()>> callbacks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_COMM_CANCELLATION_H_
