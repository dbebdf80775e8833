// gRPC adapter of the all-reduce rendezvous (served by rank 0 over a RendezvousTable).
#ifndef DPTRAIN_WORKER_COMM_RENDEZVOUS_SERVICE_H_
#define DPTRAIN_WORKER_COMM_RENDEZVOUS_SERVICE_H_

#include <string>

#include "absl/time/time.h"
#include "common/rendezvous.h"
#include "proto/peer.grpc.pb.h"

namespace dptrain {

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

#endif  // DPTRAIN_WORKER_COMM_RENDEZVOUS_SERVICE_H_
