// The tensor stream (proto/ps.proto, TensorStream/PushPull) for one ParameterShard: a
// training step chunk by chunk over one bidirectional stream of raw byte-buffer frames.
// Each call reads gradient frames and pushes each chunk as it arrives; a writer thread per
// call sends each chunk's new weights as soon as the chunk's step completes, so the
// download of early chunks overlaps the upload of later ones. Registered as the server's
// generic service: any other unknown method gets UNIMPLEMENTED.
#ifndef DPTRAIN_SERVER_TENSOR_STREAM_SERVICE_H_
#define DPTRAIN_SERVER_TENSOR_STREAM_SERVICE_H_

#include <atomic>
#include <cstdint>

#include "grpcpp/generic/async_generic_service.h"
#include "server/parameter_shard.h"

namespace dptrain {

class TensorStreamService final : public grpc::CallbackGenericService {
 public:
  // `shard` must outlive the service.
  explicit TensorStreamService(ParameterShard* shard) : shard_(shard) {}

  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override;

  // Frame bytes received and sent over all calls.
  int64_t bytes_received() const { return bytes_received_.load(); }
  int64_t bytes_sent() const { return bytes_sent_.load(); }

 private:
  friend class PushPullReactor;
  ParameterShard* const shard_;
  std::atomic<int64_t> bytes_received_{0}, bytes_sent_{0};
};

}  // namespace dptrain

#endif  // DPTRAIN_SERVER_TENSOR_STREAM_SERVICE_H_
