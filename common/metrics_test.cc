#include "common/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/metrics_http.h"
#include "common/trace.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace dptrain {
namespace {

TEST(MetricsTest, RendersCountersGaugesAndLabelsInTheTextFormat) {
  MetricsRegistry registry;
  auto& requests = registry.AddCounter("dptrain_requests_total", "Requests.", {"method", "code"});
  requests.WithLabels({"push", "OK"}).Increment(3);
  requests.WithLabels({"pull", "a\"b\\c\nd"}).Increment();
  registry.AddGauge("dptrain_version", "Version.").Get().Set(7);
  registry.AddGaugeFunction("dptrain_answer", "Read at scrape time.", [] { return 0.1; });
  const std::string text = registry.Render();
  EXPECT_NE(text.find("# HELP dptrain_requests_total Requests.\n"
                      "# TYPE dptrain_requests_total counter\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("dptrain_requests_total{method=\"push\",code=\"OK\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("dptrain_requests_total{method=\"pull\",code=\"a\\\"b\\\\c\\nd\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("# TYPE dptrain_version gauge\ndptrain_version 7\n"), std::string::npos);
  EXPECT_NE(text.find("dptrain_answer 0.1\n"), std::string::npos);
}

TEST(MetricsTest, HistogramBucketsAreCumulativeWithInclusiveUpperBounds) {
  MetricsRegistry registry;
  Histogram& h = registry.AddHistogram("dptrain_x_seconds", "X.", {0.5, 1, 2}).Get();
  for (double v : {0.1, 0.5, 0.7, 2.0, 3.0}) h.Observe(v);
  const std::string text = registry.Render();
  EXPECT_NE(text.find("dptrain_x_seconds_bucket{le=\"0.5\"} 2\n"
                      "dptrain_x_seconds_bucket{le=\"1\"} 3\n"
                      "dptrain_x_seconds_bucket{le=\"2\"} 4\n"
                      "dptrain_x_seconds_bucket{le=\"+Inf\"} 5\n"
                      "dptrain_x_seconds_sum 6.3\n"
                      "dptrain_x_seconds_count 5\n"),
            std::string::npos)
      << text;
}

TEST(MetricsTest, ConcurrentIncrementsAreNotLost) {
  MetricsRegistry registry;
  Counter& c = registry.AddCounter("dptrain_c_total", "C.").Get();
  Histogram& h = registry.AddHistogram("dptrain_h", "H.", {1}).Get();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        c.Increment();
        h.Observe(0.5);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.value(), 40000);
  EXPECT_EQ(h.count(), 40000u);
  EXPECT_EQ(h.sum(), 20000);
}

TEST(MetricsTest, FormatsSpecialValues) {
  EXPECT_EQ(FormatMetricValue(1.0 / 0.0), "+Inf");
  EXPECT_EQ(FormatMetricValue(-1.0 / 0.0), "-Inf");
  EXPECT_EQ(FormatMetricValue(0.0 / 0.0), "NaN");
  EXPECT_EQ(FormatMetricValue(0.00025), "0.00025");
  EXPECT_EQ(FormatMetricValue(123456789012), "123456789012");
}

// The body of GET `path` from 127.0.0.1:port, with the status line kept.
std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "connect failed";
  }
  const std::string request = "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  (void)!write(fd, request.data(), request.size());
  std::string response;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, n);
  close(fd);
  return response;
}

TEST(MetricsHttpTest, ServesMetricsStatusAndNotFound) {
  MetricsRegistry registry;
  registry.AddCounter("dptrain_hits_total", "Hits.").Get().Increment(2);
  MetricsHttpOptions options;
  options.bind_address = "127.0.0.1";
  options.registry = &registry;
  options.status = [] { return std::string("{\"ok\":true}"); };
  auto server = MetricsHttpServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);

  const std::string metrics = HttpGet(port, "/metrics");
  EXPECT_EQ(metrics.rfind("HTTP/1.1 200", 0), 0u) << metrics;
  EXPECT_NE(metrics.find("text/plain; version=0.0.4"), std::string::npos);
  EXPECT_NE(metrics.find("dptrain_hits_total 2\n"), std::string::npos);
  const std::string status = HttpGet(port, "/status");
  EXPECT_NE(status.find("application/json"), std::string::npos);
  EXPECT_NE(status.find("{\"ok\":true}"), std::string::npos);
  EXPECT_EQ(HttpGet(port, "/other").rfind("HTTP/1.1 404", 0), 0u);

  // A second server on the same port fails with a status naming the address.
  options.port = port;
  auto taken = MetricsHttpServer::Start(options);
  ASSERT_FALSE(taken.ok());
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(std::string(taken.status().message()).find(std::to_string(port)), std::string::npos)
      << taken.status();
}

// A TCP connection to 127.0.0.1:port that sends nothing.
int IdleConnection(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

// Issue 30 item 4: civetweb ran 2 threads, so 2 connections held open without a request made
// every scrape wait (30 s, civetweb's default request timeout) while gRPC health stayed
// SERVING. Now fewer idle connections than kMetricsHttpThreads leave scrapes untouched, more
// delay them by about kMetricsHttpRequestTimeout per wave at most, and the server closes an
// idle connection after that timeout.
TEST(MetricsHttpTest, IdleConnectionsCannotHoldScrapesBack) {
  MetricsRegistry registry;
  registry.AddCounter("dptrain_hits_total", "Hits.").Get().Increment(1);
  MetricsHttpOptions options;
  options.bind_address = "127.0.0.1";
  options.registry = &registry;
  auto server = MetricsHttpServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();

  std::vector<int> idle;
  for (int i = 0; i < kMetricsHttpThreads - 4; ++i) idle.push_back(IdleConnection(port));
  absl::SleepFor(absl::Milliseconds(100));  // Each has a thread of the server by now.
  absl::Time start = absl::Now();
  std::string scraped = HttpGet(port, "/metrics");
  EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << "idle connections held the scrape back";
  EXPECT_NE(scraped.find("dptrain_hits_total 1\n"), std::string::npos) << scraped;
  // The server closes what sent no request within its timeout.
  for (int fd : idle) {
    timeval five{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &five, sizeof(five));
    char byte;
    const ssize_t r = read(fd, &byte, 1);
    EXPECT_TRUE(r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
        << "an idle connection was left open 5 s";
    close(fd);
  }
  // Many more than the server's threads: the scrape still answers, a wave or two later.
  idle.clear();
  for (int i = 0; i < 2 * kMetricsHttpThreads; ++i) idle.push_back(IdleConnection(port));
  start = absl::Now();
  scraped = HttpGet(port, "/metrics");
  EXPECT_LT(absl::Now() - start, 4 * kMetricsHttpRequestTimeout);
  EXPECT_NE(scraped.find("dptrain_hits_total 1\n"), std::string::npos) << scraped;
  for (int fd : idle) close(fd);
}

TEST(MetricsHttpTest, RefusesABadPort) {
  MetricsRegistry registry;
  MetricsHttpOptions options;
  options.registry = &registry;
  options.port = 70000;
  EXPECT_EQ(MetricsHttpServer::Start(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TraceTest, WritesBoundedChromeTrace) {
  const std::string path = ::testing::TempDir() + "/trace.json";
  auto trace = TraceRecorder::Create(path, 2, "worker rank 0");
  ASSERT_TRUE(trace.ok()) << trace.status();
  (*trace)->NameTrack(0, "step");
  const absl::Time t0 = absl::Now();
  for (int64_t step = 0; step < 5; ++step) {
    (*trace)->Span(0, "forward", step, t0 + absl::Milliseconds(10 * step),
                   t0 + absl::Milliseconds(10 * step + 4));
    (*trace)->MarkStepDone(step);
  }
  EXPECT_EQ((*trace)->num_spans(), 2);  // Steps 0 and 1 only.
  std::ifstream in(path);
  const nlohmann::json doc = nlohmann::json::parse(in);  // Written at the end of step 1.
  int spans = 0;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "X") {
      ++spans;
      EXPECT_EQ(e["name"], "forward");
      EXPECT_EQ(e["dur"], 4000);
      EXPECT_LT(e["args"]["step"].get<int>(), 2);
    }
    if (e["ph"] == "M" && e["name"] == "thread_name") EXPECT_EQ(e["args"]["name"], "step");
  }
  EXPECT_EQ(spans, 2);
}

TEST(TraceTest, RefusesAnUnwritablePathAndZeroSteps) {
  auto bad = TraceRecorder::Create("/nonexistent-dir/trace.json", 5, "x");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("/nonexistent-dir/trace.json"),
            std::string::npos);
  EXPECT_FALSE(TraceRecorder::Create(::testing::TempDir() + "/t.json", 0, "x").ok());
}

}  // namespace
}  // namespace dptrain
