#include "worker/comm/rendezvous_service.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace dptrain {

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
