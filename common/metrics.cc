#include "common/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dptrain {

void AtomicDouble::Add(double v) {
  double old = value_.load(std::memory_order_relaxed);
  while (!value_.compare_exchange_weak(old, old + v, std::memory_order_relaxed)) {
  }
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::Observe(double v) {
  // The first bucket whose upper bound is >= v (le is inclusive); +Inf otherwise.
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_.Add(v);
}

std::vector<uint64_t> Histogram::bucket_counts() const {
  std::vector<uint64_t> counts(bounds_.size() + 1);
  for (size_t i = 0; i < counts.size(); ++i) counts[i] = buckets_[i].load(std::memory_order_relaxed);
  return counts;
}

std::vector<double> LatencyBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
          0.1,    0.25,    0.5,    1,     2.5,    5,     10,   25,    50,   100};
}

std::vector<double> StepBuckets() { return {0, 1, 2, 4, 8, 16, 32, 64, 128, 256}; }

std::string FormatMetricValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // The shortest of %.15g and %.17g that reads back as v ("0.1", not "0.10000000000000001").
  std::string shorter = absl::StrFormat("%.15g", v);
  if (std::strtod(shorter.c_str(), nullptr) == v) return shorter;
  return absl::StrFormat("%.17g", v);
}

std::string EscapeLabelValue(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

namespace {

// {a="x",b="y"} plus `extra` (e.g. le="0.5"), or "" without any label.
std::string Labels(const std::vector<std::string>& names, const std::vector<std::string>& values,
                   const std::string& extra = "") {
  std::string out;
  for (size_t i = 0; i < names.size() && i < values.size(); ++i) {
    absl::StrAppend(&out, out.empty() ? "" : ",", names[i], "=\"", EscapeLabelValue(values[i]),
                    "\"");
  }
  if (!extra.empty()) absl::StrAppend(&out, out.empty() ? "" : ",", extra);
  return out.empty() ? "" : absl::StrCat("{", out, "}");
}

}  // namespace

MetricsRegistry::Entry* MetricsRegistry::Find(const std::string& name) {
  for (auto& e : entries_) {
    if (e->name == name) return e.get();
  }
  return nullptr;
}

MetricsRegistry::Entry& MetricsRegistry::Add(const std::string& name, const std::string& help,
                                             const std::string& type) {
  entries_.push_back(std::make_unique<Entry>());
  Entry& e = *entries_.back();
  e.name = name;
  e.help = help;
  e.type = type;
  return e;
}

MetricFamily<Counter>& MetricsRegistry::AddCounter(const std::string& name,
                                                   const std::string& help,
                                                   std::vector<std::string> label_names) {
  absl::MutexLock lock(&mu_);
  if (Entry* e = Find(name); e != nullptr && e->counter != nullptr) return *e->counter;
  Entry& e = Add(name, help, "counter");
  e.counter = std::make_unique<MetricFamily<Counter>>(std::move(label_names),
                                                      [] { return std::make_unique<Counter>(); });
  return *e.counter;
}

MetricFamily<Gauge>& MetricsRegistry::AddGauge(const std::string& name, const std::string& help,
                                               std::vector<std::string> label_names) {
  absl::MutexLock lock(&mu_);
  if (Entry* e = Find(name); e != nullptr && e->gauge != nullptr) return *e->gauge;
  Entry& e = Add(name, help, "gauge");
  e.gauge = std::make_unique<MetricFamily<Gauge>>(std::move(label_names),
                                                  [] { return std::make_unique<Gauge>(); });
  return *e.gauge;
}

MetricFamily<Histogram>& MetricsRegistry::AddHistogram(const std::string& name,
                                                       const std::string& help,
                                                       std::vector<double> bounds,
                                                       std::vector<std::string> label_names) {
  absl::MutexLock lock(&mu_);
  if (Entry* e = Find(name); e != nullptr && e->histogram != nullptr) return *e->histogram;
  Entry& e = Add(name, help, "histogram");
  std::sort(bounds.begin(), bounds.end());
  e.histogram = std::make_unique<MetricFamily<Histogram>>(
      std::move(label_names), [bounds] { return std::make_unique<Histogram>(bounds); });
  return *e.histogram;
}

void MetricsRegistry::AddGaugeFunction(const std::string& name, const std::string& help,
                                       std::function<double()> read) {
  absl::MutexLock lock(&mu_);
  if (Find(name) != nullptr) return;
  Add(name, help, "gauge").read = std::move(read);
}

void MetricsRegistry::AddCounterFunction(const std::string& name, const std::string& help,
                                         std::function<double()> read) {
  absl::MutexLock lock(&mu_);
  if (Find(name) != nullptr) return;
  Add(name, help, "counter").read = std::move(read);
}

std::string MetricsRegistry::Render() const {
  absl::MutexLock lock(&mu_);
  std::string out;
  for (const auto& e : entries_) {
    absl::StrAppend(&out, "# HELP ", e->name, " ", e->help, "\n# TYPE ", e->name, " ", e->type,
                    "\n");
    if (e->read) {
      absl::StrAppend(&out, e->name, " ", FormatMetricValue(e->read()), "\n");
    } else if (e->counter != nullptr) {
      const auto& names = e->counter->label_names();
      e->counter->ForEach([&](const std::vector<std::string>& values, const Counter& c) {
        absl::StrAppend(&out, e->name, Labels(names, values), " ", FormatMetricValue(c.value()),
                        "\n");
      });
    } else if (e->gauge != nullptr) {
      const auto& names = e->gauge->label_names();
      e->gauge->ForEach([&](const std::vector<std::string>& values, const Gauge& g) {
        absl::StrAppend(&out, e->name, Labels(names, values), " ", FormatMetricValue(g.value()),
                        "\n");
      });
    } else if (e->histogram != nullptr) {
      const auto& names = e->histogram->label_names();
      e->histogram->ForEach([&](const std::vector<std::string>& values, const Histogram& h) {
        const std::vector<uint64_t> counts = h.bucket_counts();
        uint64_t cumulative = 0;
        for (size_t i = 0; i < counts.size(); ++i) {
          cumulative += counts[i];
          const std::string le =
              i < h.bounds().size() ? FormatMetricValue(h.bounds()[i]) : "+Inf";
          absl::StrAppend(&out, e->name, "_bucket",
                          Labels(names, values, absl::StrCat("le=\"", le, "\"")), " ", cumulative,
                          "\n");
        }
        // _count equals the +Inf bucket (observations racing this scrape may show in one and
        // not yet in the other; the buckets are what a histogram_quantile reads).
        absl::StrAppend(&out, e->name, "_sum", Labels(names, values), " ",
                        FormatMetricValue(h.sum()), "\n", e->name, "_count",
                        Labels(names, values), " ", cumulative, "\n");
      });
    }
  }
  return out;
}

}  // namespace dptrain
