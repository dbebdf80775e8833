#include "worker/graph/node.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

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

namespace {

// The constant's entries from `first` on must not be the batch size.
absl::Status CheckNoBatchSize(const NodeContext& ctx, size_t index, const Tensor& t, size_t first) {
  for (size_t i = first; i < t.ints.size(); ++i) {
    if (!IsBatchMultiple(t.ints[i])) continue;
    return ctx.Error(absl::StrCat(
        "input ", index, " ('", ctx.inputs[index].name,
        "') holds the batch size (dimension 0 of "
        "a Shape), known only at run time, ",
        first == 0 ? "unsupported here" : "in another place than its first entry: unsupported"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status NodeContext::CheckNotLearned(size_t index, absl::string_view role) const {
  const NodeInput* in = input(index);
  if (in == nullptr || in->constant == nullptr || !in->state || in->fixed) {
    return absl::OkStatus();
  }
  return Error(absl::StrCat("input ", index, " ('", in->name,
                            "') is an initializer of the model, "
                            "here its ",
                            role,
                            ", which cannot be learned: if it is a buffer, "
                            "name it one (gpu_worker --onnx_buffers) to keep it fixed"));
}

absl::StatusOr<const Tensor*> NodeContext::TargetShapeInput(size_t index) const {
  const NodeInput* in = input(index);
  if (in == nullptr || in->constant == nullptr || in->constant->type != Tensor::Type::kInt64) {
    return ConstantInput(index, Tensor::Type::kInt64, false);  // Its error.
  }
  if (in->constant->shape.size() != 1) {
    return Error(absl::StrCat("shape input is ", in->constant->ToString(), ", expected 1-D"));
  }
  DPTRAIN_RETURN_IF_ERROR(CheckNoBatchSize(*this, index, *in->constant, 1));
  return in->constant;
}

absl::StatusOr<std::vector<int64_t>> NodeContext::IntsInputOrAttribute(
    size_t index, absl::string_view name, bool optional, std::vector<int64_t> fallback) const {
  if (input(index) != nullptr) {
    DPTRAIN_ASSIGN_OR_RETURN(const Tensor* t, ConstantInput(index, Tensor::Type::kInt64, false));
    if (t->shape.size() != 1) return Error(absl::StrCat(name, " must be 1-D"));
    return t->ints;
  }
  if (node.attributes.count(std::string(name)) > 0) return IntsAttribute(node, name, {});
  if (!optional) return Error(absl::StrCat("has no ", name));
  return fallback;
}

absl::StatusOr<Dims> NodeContext::SoleRuntimeInput() const {
  DPTRAIN_ASSIGN_OR_RETURN(const Dims input, RuntimeInput(0));
  for (size_t i = 1; i < inputs.size(); ++i) {
    if (inputs[i].is_runtime()) {
      return Error(absl::StrCat("input ", i, " ('", inputs[i].name,
                                "') must be a constant, not a computed value"));
    }
  }
  return input;
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
  if (type == Tensor::Type::kInt64) {
    DPTRAIN_RETURN_IF_ERROR(CheckNoBatchSize(*this, index, *in->constant, 0));
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
