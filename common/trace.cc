#include "common/trace.h"

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace dptrain {

TraceRecorder::TraceRecorder(std::string path, int64_t max_steps, std::string process)
    : path_(std::move(path)),
      max_steps_(max_steps),
      process_(std::move(process)),
      origin_(absl::Now()) {}

absl::StatusOr<std::unique_ptr<TraceRecorder>> TraceRecorder::Create(const std::string& path,
                                                                     int64_t max_steps,
                                                                     const std::string& process) {
  if (path.empty()) return absl::InvalidArgumentError("trace path is empty");
  if (max_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("traced steps must be >= 1, got ", max_steps));
  }
  {
    std::ofstream probe(path, std::ios::trunc);
    if (!probe) {
      return absl::InvalidArgumentError(absl::StrCat("cannot write the trace to '", path, "'"));
    }
  }
  std::unique_ptr<TraceRecorder> recorder(new TraceRecorder(path, max_steps, process));
  recorder->dirty_ = true;  // An empty but valid trace, even if no step is ever traced.
  return recorder;
}

void TraceRecorder::NameTrack(int track, const std::string& name) {
  absl::MutexLock lock(&mu_);
  tracks_[track] = name;
  dirty_ = true;
}

void TraceRecorder::Span(int track, absl::string_view name, int64_t step, absl::Time start,
                         absl::Time end) {
  if (!Recording(step)) return;
  const int64_t start_us = absl::ToInt64Microseconds(start - origin_);
  const int64_t duration_us = std::max<int64_t>(absl::ToInt64Microseconds(end - start), 0);
  absl::MutexLock lock(&mu_);
  events_.push_back({track, std::string(name), step, start_us, duration_us});
  dirty_ = true;
}

void TraceRecorder::MarkStepDone(int64_t step) {
  if (step == max_steps_ - 1) Flush().IgnoreError();  // Flush reports nothing useful here.
}

int64_t TraceRecorder::num_spans() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(events_.size());
}

absl::Status TraceRecorder::Flush() {
  absl::MutexLock write_lock(&write_mu_);
  nlohmann::json doc;
  {
    absl::MutexLock lock(&mu_);
    if (!dirty_) return absl::OkStatus();
    dirty_ = false;
    nlohmann::json events = nlohmann::json::array();
    events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", 1}, {"tid", 0},
                      {"args", {{"name", process_}}}});
    for (const auto& [track, name] : tracks_) {
      events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", 1}, {"tid", track},
                        {"args", {{"name", name}}}});
      events.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", 1}, {"tid", track},
                        {"args", {{"sort_index", track}}}});
    }
    for (const Event& e : events_) {
      events.push_back({{"ph", "X"}, {"name", e.name}, {"pid", 1}, {"tid", e.track},
                        {"ts", e.start_us}, {"dur", e.duration_us}, {"args", {{"step", e.step}}}});
    }
    doc["traceEvents"] = std::move(events);
    doc["displayTimeUnit"] = "ms";
  }
  const std::string tmp = path_ + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << doc.dump() << "\n";
    out.close();
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write the trace to '", tmp, "'"));
  }
  if (std::rename(tmp.c_str(), path_.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot rename '", tmp, "' to '", path_, "'"));
  }
  return absl::OkStatus();
}

}  // namespace dptrain
