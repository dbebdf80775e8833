// The HTTP side of a binary's telemetry, served by civetweb (Debian's libcivetweb-dev, an
// embedded HTTP server that is well kept and small; not a hand-written one):
//   GET /metrics  the registry in the Prometheus text format (text/plain; version=0.0.4)
//   GET /status   a JSON document from `status` (404 when none is given)
// Anything else is 404.
//
// Plain HTTP (Debian 12's civetweb 1.15 crashes serving HTTPS under OpenSSL 3: measured, every
// request, with or without a client certificate), so a secured job keeps the port off the
// network unless told otherwise (telemetry_flags.h: --metrics_bind_address).
//
// Idle and slow clients are bounded: kMetricsHttpThreads connections are served at once, and
// one that has not sent its whole request within kMetricsHttpRequestTimeout is closed, so
// connections held open without a request cannot keep a scrape waiting for long.
#ifndef DPTRAIN_COMMON_METRICS_HTTP_H_
#define DPTRAIN_COMMON_METRICS_HTTP_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics.h"

struct mg_context;
struct mg_connection;

namespace dptrain {

inline constexpr int kMetricsHttpThreads = 16;
inline constexpr absl::Duration kMetricsHttpRequestTimeout = absl::Seconds(1);

struct MetricsHttpOptions {
  int port = 0;                               // 0: a free port (see port()).
  std::string bind_address = "0.0.0.0";       // Where to listen.
  const MetricsRegistry* registry = nullptr;  // Not owned; must outlive the server.
  std::function<std::string()> status;        // The /status JSON, if set.
};

class MetricsHttpServer {
 public:
  // Unavailable naming the address if it cannot be bound (e.g. the port is taken).
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const MetricsHttpOptions& options);
  ~MetricsHttpServer();  // Stops serving (waits for requests in flight).

  int port() const { return port_; }

 private:
  explicit MetricsHttpServer(const MetricsHttpOptions& options) : options_(options) {}
  static int HandleMetrics(::mg_connection* conn, void* self);
  static int HandleStatus(::mg_connection* conn, void* self);

  const MetricsHttpOptions options_;
  ::mg_context* context_ = nullptr;
  int port_ = 0;
};

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_METRICS_HTTP_H_
