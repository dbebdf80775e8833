// Metrics in the Prometheus text exposition format (version 0.0.4): counters, gauges and
// histograms, optionally with labels, kept in a MetricsRegistry that each binary owns (no
// global registry) and renders for /metrics (common/metrics_http.h).
//
// Names follow Prometheus conventions: a `dptrain_` prefix, `_total` for counters, base
// units in the name (`_seconds`, `_bytes`). Updating a metric is lock-free (atomics), so it
// may be done on hot paths and under other locks; registering takes the registry's lock.
#ifndef DPTRAIN_COMMON_METRICS_H_
#define DPTRAIN_COMMON_METRICS_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace dptrain {

// A double that threads add to without a lock.
class AtomicDouble {
 public:
  void Add(double v);
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  double Get() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Only goes up.
class Counter {
 public:
  void Increment(double v = 1.0) { value_.Add(v); }
  double value() const { return value_.Get(); }

 private:
  AtomicDouble value_;
};

class Gauge {
 public:
  void Set(double v) { value_.Set(v); }
  void Add(double v) { value_.Add(v); }
  double value() const { return value_.Get(); }

 private:
  AtomicDouble value_;
};

// Observations counted into buckets with upper bounds `bounds` (ascending; +Inf implied).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  void ObserveDuration(absl::Duration d) { Observe(absl::ToDoubleSeconds(d)); }

  const std::vector<double>& bounds() const { return bounds_; }
  // Per bucket (not cumulative), the last one being +Inf.
  std::vector<uint64_t> bucket_counts() const;
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  double sum() const { return sum_.Get(); }

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1.
  std::atomic<uint64_t> count_{0};
  AtomicDouble sum_;
};

// Bucket bounds for latencies from 100 us to ~100 s (x ~2.5 per bucket).
std::vector<double> LatencyBuckets();
// 0, 1, 2, 4, ... 256: e.g. staleness in steps.
std::vector<double> StepBuckets();

// One metric name with its help text and type, and one child per set of label values.
template <typename M>
class MetricFamily {
 public:
  MetricFamily(std::vector<std::string> label_names, std::function<std::unique_ptr<M>()> make)
      : label_names_(std::move(label_names)), make_(std::move(make)) {}

  // The child with these label values (as many as label names), made on first use.
  M& WithLabels(const std::vector<std::string>& values) {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<M>& m = children_[values];
    if (m == nullptr) m = make_();
    return *m;
  }
  // The child without labels.
  M& Get() { return WithLabels({}); }

  const std::vector<std::string>& label_names() const { return label_names_; }
  // Calls f(label values, metric) for every child, in label order.
  void ForEach(const std::function<void(const std::vector<std::string>&, const M&)>& f) const {
    absl::MutexLock lock(&mu_);
    for (const auto& [values, m] : children_) f(values, *m);
  }

 private:
  const std::vector<std::string> label_names_;
  const std::function<std::unique_ptr<M>()> make_;
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<M>> children_ ABSL_GUARDED_BY(mu_);
};

class MetricsRegistry {
 public:
  // Each name may be registered once (a second registration returns the first family; the
  // type and labels must then match, which the callers' code guarantees).
  MetricFamily<Counter>& AddCounter(const std::string& name, const std::string& help,
                                    std::vector<std::string> label_names = {});
  MetricFamily<Gauge>& AddGauge(const std::string& name, const std::string& help,
                                std::vector<std::string> label_names = {});
  MetricFamily<Histogram>& AddHistogram(const std::string& name, const std::string& help,
                                        std::vector<double> bounds,
                                        std::vector<std::string> label_names = {});
  // A gauge or counter whose value is read at scrape time (e.g. a version, bytes a service
  // counts itself). `read` must be thread-safe and must outlive the registry's use.
  void AddGaugeFunction(const std::string& name, const std::string& help,
                        std::function<double()> read);
  void AddCounterFunction(const std::string& name, const std::string& help,
                          std::function<double()> read);

  // The text exposition format of every metric, in registration order.
  std::string Render() const;

 private:
  struct Entry {
    std::string name, help, type;
    std::unique_ptr<MetricFamily<Counter>> counter;
    std::unique_ptr<MetricFamily<Gauge>> gauge;
    std::unique_ptr<MetricFamily<Histogram>> histogram;
    std::function<double()> read;
  };
  Entry* Find(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Entry& Add(const std::string& name, const std::string& help, const std::string& type)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
};

// A value in the exposition format: "+Inf", "-Inf", "NaN", or the shortest exact decimal.
std::string FormatMetricValue(double v);
// A label value with \, " and newline escaped.
std::string EscapeLabelValue(const std::string& v);

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_METRICS_H_
