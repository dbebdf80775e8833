#include "worker/comm/peer_service.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace dptrain {

grpc::Status PeerService::Deliver(grpc::ServerContext*, const proto::PeerMessage* request,
                                  proto::DeliverResponse*) {
  if (request->job_id() != job_id_) {
    return ToGrpcStatus(absl::FailedPreconditionError(
        absl::StrCat("message of job '", request->job_id(), "' sent to job '", job_id_, "'")));
  }
  if (request->data().size() % sizeof(float) != 0) {
    return ToGrpcStatus(absl::InvalidArgumentError("payload is not a whole number of fp32"));
  }
  return ToGrpcStatus(inbox_->Deposit(request->from_rank(), request->tag(), request->data()));
}

grpc::Status RendezvousService::Join(grpc::ServerContext* context,
                                     const proto::JoinRequest* request,
                                     proto::JoinResponse* response) {
  const absl::Time deadline =
      std::min(absl::Now() + timeout_, absl::FromChrono(context->deadline()));
  auto addresses = table_->Join(request->job_id(), request->rank(), request->world_size(),
                                request->address(), deadline);
  if (!addresses.ok()) return ToGrpcStatus(addresses.status());
  for (const std::string& a : *addresses) response->add_addresses(a);
  return grpc::Status::OK;
}

}  // namespace dptrain
