// Where a component writes its log lines: passed down in its options (no global logger),
// so that tests can capture and assert the exact line. The default writes to stderr.
#ifndef DPTRAIN_COMMON_LOG_SINK_H_
#define DPTRAIN_COMMON_LOG_SINK_H_

#include <functional>
#include <iostream>
#include <string>

#include "absl/strings/string_view.h"

namespace dptrain {

// Called with one line (no trailing newline). May be called from any thread; must be
// thread-safe.
using LogSink = std::function<void(absl::string_view line)>;

inline LogSink StderrLog() {
  return [](absl::string_view line) { std::cerr << std::string(line) + "\n" << std::flush; };
}

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_LOG_SINK_H_
