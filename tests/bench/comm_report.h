// Results of the communication benchmark, the cost model fitted to them, and the report
// files (CSV, Markdown, SVG).
#ifndef DPTRAIN_TESTS_BENCH_COMM_REPORT_H_
#define DPTRAIN_TESTS_BENCH_COMM_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

namespace dptrain {

struct Point {
  std::string mode;  // ps | master | allreduce
  int workers = 1;
  int shards = 1;
  int64_t elements = 0;  // fp32 gradient elements (K = 4 * elements bytes)
  std::string what;      // "16 MiB" or a model name
  std::string Label() const;
  double bytes() const { return 4.0 * static_cast<double>(elements); }
};

struct Result {
  Point point;
  double seconds = 0;          // Median time of one synchronisation (all ranks done).
  double worker_sent = 0;      // Bytes per synchronisation, busiest worker.
  double worker_received = 0;
  double shard_sent = 0;       // Shard 0 (the reducer's link in master mode).
  double shard_received = 0;
  double AlgBw() const { return point.bytes() / seconds; }
  // NCCL-tests' bus bandwidth: algbw * 2(N-1)/N (for ps/master: the all-reduce equivalent).
  double BusBw() const;
};

// Bytes on the busiest link and messages on the critical path of one synchronisation,
// by the mode's algorithm (the cost model's inputs).
struct Traffic {
  double bytes = 0;
  double messages = 0;
};
Traffic ModelTraffic(const std::string& mode, int workers, int shards, double bytes);

// T = alpha * messages + beta * bytes, least squares over a mode's points with N >= 2.
struct CostModel {
  double alpha = 0;  // Seconds per message on the critical path.
  double beta = 0;   // Seconds per byte on the busiest link.
  double Predict(const Traffic& t) const { return alpha * t.messages + beta * t.bytes; }
};
CostModel FitCostModel(const std::vector<Result>& results, const std::string& mode);

std::string FormatRow(const Result& r);
// Results from a comm.csv written by WriteReport (to redo the report without measuring).
std::vector<Result> ReadCsv(const std::string& path);
// Writes <dir>/comm.csv, comm.md (tables, model validation, predictions) and comm.svg.
bool WriteReport(const std::string& dir, const std::vector<Result>& results);

}  // namespace dptrain

#endif  // DPTRAIN_TESTS_BENCH_COMM_REPORT_H_
