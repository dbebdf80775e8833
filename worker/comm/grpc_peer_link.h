// PeerLink over gRPC: Send is an asynchronous Deliver call to the peer's Peer service (at
// most `max_in_flight` outstanding), Recv takes from this rank's Mailbox, which the local
// Peer service fills.
#ifndef DPTRAIN_WORKER_COMM_GRPC_PEER_LINK_H_
#define DPTRAIN_WORKER_COMM_GRPC_PEER_LINK_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/mailbox.h"
#include "common/peer_link.h"
#include "grpcpp/completion_queue.h"
#include "proto/peer.grpc.pb.h"

namespace dptrain {

struct GrpcPeerLinkOptions {
  std::string job_id = "dptrain";
  int rank = 0;
  std::vector<std::string> addresses;  // Peer service of every rank, by rank.
  absl::Duration timeout = absl::Seconds(60);  // Longest wait for one message.
  int max_in_flight = 64;
};

class GrpcPeerLink : public PeerLink {
 public:
  // `inbox` (filled by this rank's Peer service) must outlive the link.
  static absl::StatusOr<std::unique_ptr<GrpcPeerLink>> Create(const GrpcPeerLinkOptions& options,
                                                             Mailbox* inbox);
  ~GrpcPeerLink() override;  // Waits briefly for sends in flight.

  int rank() const override { return options_.rank; }
  int world_size() const override { return static_cast<int>(options_.addresses.size()); }
  absl::Status Send(int peer, uint64_t tag, absl::Span<const float> data) override;
  absl::Status Recv(int peer, uint64_t tag, absl::Span<float> out) override;
  int64_t bytes_sent() const override { return sent_.load(); }
  int64_t bytes_received() const override { return received_.load(); }

 private:
  struct Call;
  GrpcPeerLink(const GrpcPeerLinkOptions& options, Mailbox* inbox);
  void Poll();
  absl::Status FirstError();

  const GrpcPeerLinkOptions options_;
  Mailbox* const inbox_;
  std::vector<std::unique_ptr<proto::Peer::Stub>> stubs_;
  grpc::CompletionQueue cq_;
  std::thread poller_;
  absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> sent_{0}, received_{0};
};

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_COMM_GRPC_PEER_LINK_H_
