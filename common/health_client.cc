#include "common/health_client.h"

#include <vector>

#include "common/grpc_status.h"
#include "common/net.h"
#include "grpcpp/client_context.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"

namespace dptrain {

absl::StatusOr<ServingStatus> CheckHealth(const std::string& address, absl::Duration timeout) {
  return CheckHealth(address, timeout, *Credentials::Plaintext());
}

absl::StatusOr<ServingStatus> CheckHealth(const std::string& address, absl::Duration timeout,
                                          const Credentials& credentials) {
  grpc::GenericStub stub(MakeChannel(address, credentials));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  grpc::Slice empty("");
  const grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  grpc::CompletionQueue cq;
  auto call = stub.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check", request, &cq);
  call->StartCall();
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag;
  bool ok;
  cq.Next(&tag, &ok);
  if (!status.ok()) return FromGrpcStatus(status, "health check of " + address);
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return absl::DataLossError("unreadable health answer");
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // HealthCheckResponse { ServingStatus status = 1; }: absent field means UNKNOWN (0).
  if (bytes.empty()) return ServingStatus::kUnknown;
  if (bytes.size() == 2 && bytes[0] == 0x08 && bytes[1] >= 0 && bytes[1] <= 3) {
    return static_cast<ServingStatus>(bytes[1]);
  }
  return absl::DataLossError("undecodable health answer from " + address);
}

}  // namespace dptrain
