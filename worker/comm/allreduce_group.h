// Sets up all-reduce mode for one rank: its TCP data listener on a free port (rank 0 also
// serves the Rendezvous over gRPC on the master port), the rendezvous through rank 0, and
// the PeerLink to the other ranks.
#ifndef DPTRAIN_WORKER_COMM_ALLREDUCE_GROUP_H_
#define DPTRAIN_WORKER_COMM_ALLREDUCE_GROUP_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/credentials.h"
#include "common/rendezvous.h"
#include "grpcpp/server.h"
#include "worker/comm/rendezvous_service.h"
#include "worker/comm/tcp_peer_link.h"

namespace dptrain {

struct AllReduceGroupOptions {
  std::string job_id = "dptrain";
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;         // Rank 0 listens here (0: a free port, see master_port()).
  std::string advertise_host;  // Where peers reach this rank; empty: the local IP toward master.
  // Where this rank's listeners (ring data port; rank 0: the rendezvous) accept connections.
  std::string bind_address = "0.0.0.0";
  absl::Duration connect_timeout = absl::Seconds(60);  // For the rendezvous.
  absl::Duration timeout = absl::Seconds(60);          // For one message.
  // The largest message a peer may send (the ring's chunk, in bytes); see TcpPeerLinkOptions.
  uint64_t max_message_bytes = uint64_t{64} << 20;
  // TLS and the job token of the rendezvous (rank 0's server, the others' channels); the
  // token also keys the ring's TCP handshake. Default: plaintext, a plain hello.
  std::shared_ptr<const Credentials> credentials = Credentials::Plaintext();
};

class AllReduceGroup {
 public:
  // Rank 0 returns as soon as it listens (call Join next); see Join.
  static absl::StatusOr<std::unique_ptr<AllReduceGroup>> Listen(const AllReduceGroupOptions& o);
  ~AllReduceGroup();

  // The port rank 0 listens on (meaningful on rank 0).
  int master_port() const { return port_; }
  // Joins the rendezvous (waiting for every rank up to connect_timeout) and connects the link.
  absl::Status Join();
  PeerLink& link() { return *link_; }

 private:
  AllReduceGroup() = default;

  AllReduceGroupOptions options_;
  std::unique_ptr<TcpListener> listener_;
  std::unique_ptr<RendezvousTable> table_;
  std::unique_ptr<RendezvousService> rendezvous_service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
  std::unique_ptr<TcpPeerLink> link_;
};

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_COMM_ALLREDUCE_GROUP_H_
