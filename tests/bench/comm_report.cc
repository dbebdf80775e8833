#include "tests/bench/comm_report.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dptrain {

std::string Point::Label() const {
  return mode == "ps" ? absl::StrCat(mode, " S=", shards, " N=", workers, " ", what)
                      : absl::StrCat(mode, " N=", workers, " ", what);
}

double Result::BusBw() const {
  const int n = point.workers;
  return AlgBw() * 2.0 * (n - 1) / n;
}

Traffic ModelTraffic(const std::string& mode, int n, int s, double k) {
  const double chunk = 4.0 * (1 << 20);
  const double chunks = std::max(1.0, std::ceil(k / chunk));
  if (mode == "allreduce" || mode == "allreduce_replicated" || mode == "ring") {
    // 2(N-1) ring steps, each a segment of K/N per worker link.
    return {2.0 * (n - 1) / n * k, 2.0 * (n - 1)};
  }
  // Push then pull: every worker's K goes through the shards; the busiest shard carries
  // N*K/S each way (its chunks' share), a worker K each way.
  const int shards = mode == "master" ? 1 : s;
  return {std::max(k, n * k / shards), 2.0 + chunks / shards};
}

CostModel FitCostModel(const std::vector<Result>& results, const std::string& mode) {
  // Normal equations of the 2-parameter least squares, no intercept, on relative errors
  // ((predicted - measured) / measured): the points span 1 MiB to 8 x 64 MiB, and absolute
  // errors would let the largest few decide the fit for all.
  double mm = 0, mb = 0, bb = 0, mt = 0, bt = 0;
  for (const Result& r : results) {
    if (r.point.mode != mode || r.point.workers < 2 || r.seconds <= 0) continue;
    const Traffic t = ModelTraffic(mode, r.point.workers, r.point.shards, r.point.bytes());
    const double m = t.messages / r.seconds, b = t.bytes / r.seconds;
    mm += m * m;
    mb += m * b;
    bb += b * b;
    mt += m;
    bt += b;
  }
  CostModel m;
  const double det = mm * bb - mb * mb;
  if (std::abs(det) < 1e-30) return m;
  m.alpha = (mt * bb - bt * mb) / det;
  m.beta = (mm * bt - mb * mt) / det;
  if (m.alpha < 0) {  // Latency not resolvable: fit bytes alone.
    m.alpha = 0;
    m.beta = bt / bb;
  }
  return m;
}

std::string FormatRow(const Result& r) {
  const double k = r.point.bytes();
  return absl::StrFormat(
      "| %s | %d | %s | %s | %.2f | %.3f | %.3f | %.2f | %.2f | %.2f | %.2f |", r.point.mode,
      r.point.workers, r.point.mode == "ps" ? absl::StrCat(r.point.shards) : "-", r.point.what,
      r.seconds * 1e3, r.AlgBw() / 1e9, r.BusBw() / 1e9, r.worker_sent / k,
      r.worker_received / k, r.shard_received / k, r.shard_sent / k);
}

namespace {

void WriteSvg(std::ostream& out, const std::vector<Result>& results, const std::string& what) {
  // Bus bandwidth against world size, one line per mode (and shard count).
  std::map<std::string, std::vector<std::pair<int, double>>> lines;
  double ymax = 0.1;
  for (const Result& r : results) {
    if (r.point.what != what || r.point.workers < 2) continue;
    const std::string key = r.point.mode == "ps" ? absl::StrCat("ps S=", r.point.shards)
                                                 : r.point.mode;
    lines[key].push_back({r.point.workers, r.BusBw() / 1e9});
    ymax = std::max(ymax, r.BusBw() / 1e9);
  }
  const int w = 560, h = 360, left = 60, bottom = 40, top = 30, right = 150;
  auto x = [&](int n) { return left + (std::log2(n) - 1) / 2.0 * (w - left - right); };
  auto y = [&](double v) { return h - bottom - v / (ymax * 1.1) * (h - bottom - top); };
  out << absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" "
      "fill=\"white\"/>\n<text x=\"%d\" y=\"18\">Bus bandwidth (GB/s), %s gradient, loopback"
      "</text>\n",
      w, h, left, what);
  out << absl::StrFormat("<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n",
                         left, h - bottom, w - right, h - bottom);
  out << absl::StrFormat("<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n",
                         left, top, left, h - bottom);
  for (int n : {2, 4, 8}) {
    out << absl::StrFormat("<text x=\"%.0f\" y=\"%d\" text-anchor=\"middle\">N=%d</text>\n",
                           x(n), h - bottom + 18, n);
  }
  for (int i = 0; i <= 4; ++i) {
    const double v = ymax * 1.1 * i / 4;
    out << absl::StrFormat("<text x=\"%d\" y=\"%.0f\" text-anchor=\"end\">%.2f</text>\n",
                           left - 6, y(v) + 4, v);
  }
  const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};
  int c = 0;
  for (auto& [key, pts] : lines) {
    std::sort(pts.begin(), pts.end());
    std::string path;
    for (auto& [n, v] : pts) absl::StrAppend(&path, path.empty() ? "M" : " L", x(n), ",", y(v));
    out << absl::StrFormat(
        "<path d=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\"/>\n<text x=\"%d\" "
        "y=\"%d\" fill=\"%s\">%s</text>\n",
        path, colors[c % 6], w - right + 10, top + 16 * (c + 1), colors[c % 6], key);
    ++c;
  }
  out << "</svg>\n";
}

}  // namespace

std::vector<Result> ReadCsv(const std::string& path) {
  std::vector<Result> results;
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);  // Header.
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream fields(line);
    for (std::string v; std::getline(fields, v, ',');) f.push_back(v);
    if (f.size() < 12) continue;
    Result r;
    r.point.mode = f[0];
    r.point.workers = std::stoi(f[1]);
    r.point.shards = std::stoi(f[2]);
    r.point.what = f[3];
    r.point.elements = static_cast<int64_t>(std::stod(f[4]) / 4);
    r.seconds = std::stod(f[5]);
    r.worker_sent = std::stod(f[8]);
    r.worker_received = std::stod(f[9]);
    r.shard_received = std::stod(f[10]);
    r.shard_sent = std::stod(f[11]);
    results.push_back(r);
  }
  return results;
}

bool WriteReport(const std::string& dir, const std::vector<Result>& results) {
  mkdir(dir.c_str(), 0755);
  std::ofstream csv(dir + "/comm.csv");
  csv << "mode,workers,shards,what,bytes,seconds,algbw_GBps,busbw_GBps,worker_sent_bytes,"
         "worker_received_bytes,shard0_received_bytes,shard0_sent_bytes\n";
  for (const Result& r : results) {
    csv << absl::StrFormat("%s,%d,%d,%s,%.0f,%.6f,%.4f,%.4f,%.0f,%.0f,%.0f,%.0f\n", r.point.mode,
                           r.point.workers, r.point.shards, r.point.what, r.point.bytes(),
                           r.seconds, r.AlgBw() / 1e9, r.BusBw() / 1e9, r.worker_sent,
                           r.worker_received, r.shard_received, r.shard_sent);
  }
  std::ofstream md(dir + "/comm.md");
  md << "# Communication benchmark (loopback, this machine)\n\n"
        "One synchronisation of a K-byte fp32 gradient: median over repetitions. Traffic "
        "columns are per synchronisation in units of K (the program's own byte counters): "
        "the busiest worker's sent/received, and shard 0's received/sent (in master mode, "
        "the reducer's link). busbw = algbw x 2(N-1)/N as nccl-tests define it (for ps and "
        "master: the all-reduce equivalent).\n\n"
        "| mode | N | S | size | time ms | algbw GB/s | busbw GB/s | worker out /K | "
        "worker in /K | shard0 in /K | shard0 out /K |\n|---|---|---|---|---|---|---|---|---|"
        "---|---|\n";
  for (const Result& r : results) md << FormatRow(r) << "\n";

  md << "\n## Cost model: T = alpha x messages + beta x bytes on the busiest link\n\n"
        "Fitted per mode on the points above with N >= 2 (least squares on relative error). Bytes on the "
        "busiest link: ring 2(N-1)/N K per worker; ps max(K, N K / S) per shard; master N K. "
        "Messages on the critical path: ring 2(N-1); ps/master 2 + chunks/S.\n\n"
        "| mode | alpha (us/message) | beta (ns/byte) | effective GB/s |\n|---|---|---|---|\n";
  std::map<std::string, CostModel> models;
  for (const std::string mode : {"allreduce", "ps", "master"}) {
    CostModel m = FitCostModel(results, mode);
    if (m.beta <= 0) continue;
    models[mode] = m;
    md << absl::StrFormat("| %s | %.1f | %.3f | %.2f |\n", mode, m.alpha * 1e6, m.beta * 1e9,
                          1e-9 / m.beta);
  }
  md << "\n### Predicted vs measured (N >= 2)\n\n| point | measured ms | predicted ms | error |\n"
        "|---|---|---|---|\n";
  for (const Result& r : results) {
    auto it = models.find(r.point.mode);
    if (it == models.end() || r.point.workers < 2) continue;
    const double pred = it->second.Predict(
        ModelTraffic(r.point.mode, r.point.workers, r.point.shards, r.point.bytes()));
    md << absl::StrFormat("| %s | %.2f | %.2f | %+.0f%% |\n", r.point.Label(), r.seconds * 1e3,
                          pred * 1e3, (pred / r.seconds - 1) * 100);
  }
  md << "\n## Beyond one machine: predicted synchronisation time of ResNet-18 (44.7 MB)\n\n"
        "The same traffic model on a network, each PS shard on its own machine, alpha = "
        "25 us per message (datacenter TCP latency plus software; the loopback alpha above "
        "also holds the cost of running up to 8 ranks on 2 cores, so it is not used). Two "
        "bounds per byte: the wire (8 / link bit rate), for an implementation that keeps up "
        "with the link; and this implementation, whose measured per-byte cost (beta above) "
        "is slower than a 10 Gbit/s wire, so its times do not depend on the link. Best mode "
        "in bold.\n\n"
        "| per-byte bound | N | ring ms | ps S=N/4 ms | ps S=N/2 ms | ps S=N ms | master ms |\n"
        "|---|---|---|---|---|---|---|\n";
  const double k = 4.0 * 11175818;  // ResNet-18 (d2l, 10 classes) in fp32.
  const double net_alpha = 25e-6;
  auto beta_of = [&](const std::string& mode, double wire) {
    auto it = models.find(mode);
    return it == models.end() ? wire : std::max(wire, it->second.beta);
  };
  auto row = [&](const std::string& label, double ring_beta, double ps_beta, double master_beta,
                 int n) {
    const CostModel ring{net_alpha, ring_beta}, ps{net_alpha, ps_beta},
        master{net_alpha, master_beta};
    const std::vector<double> t = {ring.Predict(ModelTraffic("allreduce", n, 1, k)),
                                   ps.Predict(ModelTraffic("ps", n, std::max(1, n / 4), k)),
                                   ps.Predict(ModelTraffic("ps", n, std::max(1, n / 2), k)),
                                   ps.Predict(ModelTraffic("ps", n, n, k)),
                                   master.Predict(ModelTraffic("master", n, 1, k))};
    const double best = *std::min_element(t.begin(), t.end());
    md << absl::StrFormat("| %s | %d |", label, n);
    for (double v : t) {
      md << (v == best ? absl::StrFormat(" **%.1f** |", v * 1e3)
                       : absl::StrFormat(" %.1f |", v * 1e3));
    }
    md << "\n";
  };
  for (double gbit : {10.0, 25.0, 100.0}) {
    const double wire = 8.0 / (gbit * 1e9);
    for (int n : {2, 8, 64, 256, 1024}) {
      row(absl::StrFormat("wire %.0f Gbit/s", gbit), wire, wire, wire, n);
    }
  }
  const double wire10 = 8.0 / 10e9;
  for (int n : {2, 8, 64, 256, 1024}) {
    row("this implementation", beta_of("allreduce", wire10), beta_of("ps", wire10),
        beta_of("master", wire10), n);
  }
  md << "\nCrossovers (from the model): the master's N K grows linearly with N, so it loses "
        "to the ring from N = 2 on any link. A PS with S shards moves N K / S per shard "
        "against the ring's 2(N-1)/N K per worker: it matches the ring at S = N^2 / (2(N-1)) "
        "~ N/2 shards and beats it with more (and with fewer messages: 2 + chunks/S against "
        "2(N-1), which matters at large N). Pick ring all-reduce when you have no spare "
        "machines, a sharded PS when you can give it about N/2 shard machines or more.\n\n"
        "![bus bandwidth](comm.svg)\n";
  std::ofstream svg(dir + "/comm.svg");
  WriteSvg(svg, results, "64 MiB");
  if (!csv.good() || !md.good() || !svg.good()) {
    std::cerr << "cannot write the report to " << dir << "\n";
    return false;
  }
  std::cout << "wrote " << dir << "/comm.csv, comm.md, comm.svg" << std::endl;
  return true;
}

}  // namespace dptrain
