// For tests: a LogSink that keeps the lines, to assert on the exact line a component logs.
#ifndef DPTRAIN_COMMON_CAPTURED_LOG_H_
#define DPTRAIN_COMMON_CAPTURED_LOG_H_

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/log_sink.h"

namespace dptrain {

class CapturedLog {
 public:
  // Valid while this object lives.
  LogSink sink() {
    return [this](absl::string_view line) {
      absl::MutexLock lock(&mu_);
      lines_.emplace_back(line);
    };
  }
  std::vector<std::string> lines() {
    absl::MutexLock lock(&mu_);
    return lines_;
  }
  // How many lines contain `text`.
  int Count(absl::string_view text) {
    absl::MutexLock lock(&mu_);
    int n = 0;
    for (const std::string& l : lines_) n += absl::StrContains(l, text) ? 1 : 0;
    return n;
  }
  // Polls until `count` lines contain `text`; false after `limit` (a bound, not a timing
  // assertion: tests use it to wait for what a background thread logs).
  bool WaitFor(absl::string_view text, int count = 1, absl::Duration limit = absl::Seconds(20)) {
    const absl::Time give_up = absl::Now() + limit;
    while (Count(text) < count) {
      if (absl::Now() > give_up) return false;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return true;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_CAPTURED_LOG_H_
