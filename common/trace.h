// A step timeline in the Chrome trace-event format (JSON; opens in Perfetto or
// chrome://tracing): complete ("X") events on named tracks of one process, recorded for the
// first `max_steps` steps only, so a long job does not fill the disk.
//
// The file is written whole (temporary file + rename) when the last traced step ends
// (MarkStepDone) and again at Flush (e.g. at exit), so a job that stops early still leaves
// what it recorded. Thread-safe.
#ifndef DPTRAIN_COMMON_TRACE_H_
#define DPTRAIN_COMMON_TRACE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace dptrain {

class TraceRecorder {
 public:
  // Checks now that `path` can be written (InvalidArgument naming it otherwise), so a bad
  // --trace_out stops a binary before any work. `process` names the process in the viewer
  // (e.g. "worker rank 0"); `max_steps` >= 1.
  static absl::StatusOr<std::unique_ptr<TraceRecorder>> Create(const std::string& path,
                                                               int64_t max_steps,
                                                               const std::string& process);

  // Whether events of `step` are recorded (step < max_steps).
  bool Recording(int64_t step) const { return step >= 0 && step < max_steps_; }
  // Gives track `track` (a row in the viewer; 0 is the first) a name.
  void NameTrack(int track, const std::string& name);
  // A span [start, end) named `name` on `track`, for `step` (dropped unless Recording(step)).
  void Span(int track, absl::string_view name, int64_t step, absl::Time start, absl::Time end);
  // `step` ended; the file is written when it is the last one recorded.
  void MarkStepDone(int64_t step);
  // Writes what was recorded (if anything changed since the last write).
  absl::Status Flush();

  int64_t max_steps() const { return max_steps_; }
  const std::string& path() const { return path_; }
  // Spans recorded so far.
  int64_t num_spans() const;

 private:
  TraceRecorder(std::string path, int64_t max_steps, std::string process);

  struct Event {
    int track;
    std::string name;
    int64_t step;
    int64_t start_us, duration_us;
  };

  const std::string path_;
  const int64_t max_steps_;
  const std::string process_;
  const absl::Time origin_;  // ts 0 of the file.
  mutable absl::Mutex mu_;
  std::vector<Event> events_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::string> tracks_ ABSL_GUARDED_BY(mu_);
  bool dirty_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex write_mu_;  // One write at a time.
};

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_TRACE_H_
