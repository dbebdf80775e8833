// Small networking helpers shared by both binaries: channels and port reporting.
#ifndef DPTRAIN_COMMON_NET_H_
#define DPTRAIN_COMMON_NET_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/credentials.h"
#include "grpcpp/channel.h"
#include "grpcpp/server_builder.h"

namespace dptrain {

// Largest gRPC message either side accepts: a whole shard's weights travel in one message.
inline constexpr int kMaxMessageBytes = 1 << 30;

// A channel to `address` ("host:port") with the message limits above and `credentials`
// (TLS and the job token when they are on).
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const Credentials& credentials);
// The same in plaintext without a token (tests and benchmarks).
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address);

// Applies the message limits to a server under construction.
void ConfigureServerBuilder(grpc::ServerBuilder& builder);

// Whether a server can listen on `address` ("host:port" with a numeric IPv4 host): OK for
// port 0 (any free port) or a port that binds, Unavailable "cannot listen on ADDRESS: ..."
// naming the reason (address already in use, permission denied) otherwise. Servers call it
// before gRPC tries, so that a taken port is our one line rather than gRPC's log line first.
// A host that is not a numeric IPv4 address is left for gRPC to judge (OK).
absl::Status CheckCanListen(const std::string& address);

// Writes `port` followed by a newline to `path` atomically (temp file + rename), so a
// reader never sees a partial file.
absl::Status WritePortFile(const std::string& path, int port);

// The local IP address this machine uses to reach `host` (no packet is sent: a UDP socket
// is connected and its local address read). For workers that advertise where peers can
// reach them. Unavailable if `host` does not resolve or is unreachable.
absl::StatusOr<std::string> LocalAddressToward(const std::string& host);

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_NET_H_
