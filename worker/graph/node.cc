#include "worker/graph/node.h"

#include "absl/strings/str_cat.h"

namespace dptrain {
namespace graph {

absl::Status NodeContext::Error(absl::string_view what) const {
  return absl::InvalidArgumentError(absl::StrCat("node '", node.name, "' (", node.op, "): ", what));
}

absl::StatusOr<Dims> NodeContext::RuntimeInput(size_t index) const {
  const NodeInput* in = input(index);
  if (in == nullptr) return Error(absl::StrCat("input ", index, " is missing"));
  if (!in->is_runtime()) {
    return Error(absl::StrCat("input ", index, " ('", in->name,
                              "') must be a computed value, not a constant"));
  }
  return *in->dims;
}

absl::StatusOr<const Tensor*> NodeContext::ConstantInput(size_t index, Tensor::Type type,
                                                         bool optional) const {
  const NodeInput* in = input(index);
  if (in == nullptr) {
    if (optional) return nullptr;
    return Error(absl::StrCat("input ", index, " is missing"));
  }
  if (in->constant == nullptr) {
    return Error(absl::StrCat("input ", index, " ('", in->name,
                              "') must be a constant (an initializer), not a computed value"));
  }
  if (in->constant->type != type) {
    return Error(absl::StrCat("input ", index, " ('", in->name, "') is ", in->constant->ToString(),
                              ", expected ", type == Tensor::Type::kFloat ? "float" : "int64"));
  }
  return in->constant;
}

int64_t NodeTensorSpec::size() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace graph
}  // namespace dptrain
