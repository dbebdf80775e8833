// The shard's raw-byte methods (gRPC's callback generic service, one per server): the tensor
// stream (tensor_stream_service.h) and the sparse rows (sparse_rows_methods.h) each add their
// methods by full name; any other unknown method is UNIMPLEMENTED.
#ifndef DPTRAIN_SERVER_GENERIC_METHODS_H_
#define DPTRAIN_SERVER_GENERIC_METHODS_H_

#include <functional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "grpcpp/generic/async_generic_service.h"

namespace dptrain {

class GenericMethods final : public grpc::CallbackGenericService {
 public:
  using ReactorFactory =
      std::function<grpc::ServerGenericBidiReactor*(grpc::GenericCallbackServerContext*)>;
  // Before the server starts. `method` is the full name ("/package.Service/Method").
  void Add(const std::string& method, ReactorFactory factory);

  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override;

 private:
  absl::flat_hash_map<std::string, ReactorFactory> methods_;
};

}  // namespace dptrain

#endif  // DPTRAIN_SERVER_GENERIC_METHODS_H_
