// gRPC adapters of all-reduce mode: the Peer service (stores arriving messages in the
// rank's Mailbox) and the Rendezvous service (rank 0 only, over a RendezvousTable).
#ifndef DPTRAIN_WORKER_COMM_PEER_SERVICE_H_
#define DPTRAIN_WORKER_COMM_PEER_SERVICE_H_

#include <string>

#include "absl/time/time.h"
#include "common/mailbox.h"
#include "common/rendezvous.h"
#include "proto/peer.grpc.pb.h"

namespace dptrain {

class PeerService final : public proto::Peer::Service {
 public:
  PeerService(std::string job_id, Mailbox* inbox) : job_id_(std::move(job_id)), inbox_(inbox) {}
  grpc::Status Deliver(grpc::ServerContext* context, const proto::PeerMessage* request,
                       proto::DeliverResponse* response) override;

 private:
  const std::string job_id_;
  Mailbox* const inbox_;
};

class RendezvousService final : public proto::Rendezvous::Service {
 public:
  RendezvousService(RendezvousTable* table, absl::Duration timeout)
      : table_(table), timeout_(timeout) {}
  grpc::Status Join(grpc::ServerContext* context, const proto::JoinRequest* request,
                    proto::JoinResponse* response) override;

 private:
  RendezvousTable* const table_;
  const absl::Duration timeout_;
};

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_COMM_PEER_SERVICE_H_
