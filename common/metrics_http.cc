#include "common/metrics_http.h"

#include <civetweb.h>

#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace dptrain {
namespace {

void Reply(struct mg_connection* conn, int code, const char* reason, const char* content_type,
           const std::string& body) {
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
            "Connection: close\r\n\r\n",
            code, reason, content_type, body.size());
  mg_write(conn, body.data(), body.size());
}

// civetweb's own log lines (e.g. a client that went away) are not errors of ours.
int QuietLog(const struct mg_connection*, const char*) { return 1; }

}  // namespace

int MetricsHttpServer::HandleMetrics(struct mg_connection* conn, void* self) {
  auto* server = static_cast<MetricsHttpServer*>(self);
  Reply(conn, 200, "OK", "text/plain; version=0.0.4; charset=utf-8",
        server->options_.registry->Render());
  return 200;
}

int MetricsHttpServer::HandleStatus(struct mg_connection* conn, void* self) {
  auto* server = static_cast<MetricsHttpServer*>(self);
  if (!server->options_.status) {
    Reply(conn, 404, "Not Found", "text/plain", "no status here\n");
    return 404;
  }
  Reply(conn, 200, "OK", "application/json", server->options_.status() + "\n");
  return 200;
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const MetricsHttpOptions& options) {
  if (options.registry == nullptr) {
    return absl::InvalidArgumentError("metrics server: no registry given");
  }
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics port must be in [0, 65535], got ", options.port));
  }
  static std::once_flag init_once;  // civetweb's process-wide init (idempotent by contract).
  std::call_once(init_once, [] { mg_init_library(0); });

  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer(options));
  const std::string ports = absl::StrCat(options.bind_address, ":", options.port);
  const std::string threads = std::to_string(kMetricsHttpThreads);
  const std::string timeout_ms =
      std::to_string(absl::ToInt64Milliseconds(kMetricsHttpRequestTimeout));
  const char* config[] = {
      "listening_ports",  ports.c_str(),       "num_threads", threads.c_str(), "request_timeout_ms",
      timeout_ms.c_str(), "enable_keep_alive", "no",          nullptr};
  struct mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof(callbacks));
  callbacks.log_message = QuietLog;
  struct mg_init_data init;
  std::memset(&init, 0, sizeof(init));
  init.callbacks = &callbacks;
  init.configuration_options = config;
  char error_text[256] = {0};
  struct mg_error_data error;
  std::memset(&error, 0, sizeof(error));
  error.text = error_text;
  error.text_buffer_size = sizeof(error_text);
  server->context_ = mg_start2(&init, &error);
  if (server->context_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", ports, ": ",
                                               error_text[0] != 0 ? error_text : "bind failed"));
  }
  mg_set_request_handler(server->context_, "/metrics$", &MetricsHttpServer::HandleMetrics,
                         server.get());
  mg_set_request_handler(server->context_, "/status$", &MetricsHttpServer::HandleStatus,
                         server.get());
  struct mg_server_port bound[2];
  if (mg_get_server_ports(server->context_, 2, bound) < 1) {
    return absl::InternalError("metrics server: civetweb reports no listening port");
  }
  server->port_ = bound[0].port;
  return server;
}

MetricsHttpServer::~MetricsHttpServer() {
  if (context_ != nullptr) mg_stop(context_);
}

}  // namespace dptrain
