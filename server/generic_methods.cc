#include "server/generic_methods.h"

#include <utility>

namespace dptrain {

void GenericMethods::Add(const std::string& method, ReactorFactory factory) {
  methods_[method] = std::move(factory);
}

grpc::ServerGenericBidiReactor* GenericMethods::CreateReactor(
    grpc::GenericCallbackServerContext* context) {
  auto it = methods_.find(context->method());
  if (it == methods_.end()) return grpc::CallbackGenericService::CreateReactor(context);
  return it->second(context);
}

}  // namespace dptrain
