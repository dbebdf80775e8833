#include "worker/nn/safetensors.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"

namespace dptrain {
namespace nn {
namespace {

// Every tensor of `model`: params() in weights(), then buffers() in buffer_values().
using ModelTensor = std::pair<const ParamInfo*, std::vector<float>*>;
absl::StatusOr<std::vector<ModelTensor>> ModelTensors(Model& model) {
  std::vector<ModelTensor> out;
  for (const ParamInfo& p : model.params()) out.push_back({&p, &model.weights()});
  for (const ParamInfo& b : model.buffers()) out.push_back({&b, &model.buffer_values()});
  for (const auto& [info, values] : out) {
    if (info->offset < 0 || info->size != NumElements(info->shape) ||
        info->offset + info->size > static_cast<int64_t>(values->size())) {
      return absl::FailedPreconditionError(absl::StrCat("model ", model.name(), ": tensor '",
                                                        info->name, "' lies outside its buffer"));
    }
  }
  return out;
}

}  // namespace

absl::Status SaveModel(Model& model, const std::string& path) {
  auto model_tensors = ModelTensors(model);
  if (!model_tensors.ok()) return model_tensors.status();
  std::vector<NamedTensor> tensors;
  for (const auto& [info, values] : *model_tensors) {
    tensors.push_back({info->name, info->shape, values->data() + info->offset});
  }
  return SaveSafetensors(path, tensors, {{"format", "pt"}, {"model", model.name()}});
}

absl::Status SetModelWeights(const SafetensorsContents& contents, Model& model) {
  // The tensors decide, as load_state_dict's: a model of another name (e.g. a copy of the same
  // ONNX file) with the same tensors loads; the file's model is named where they differ.
  const auto it = contents.metadata.find("model");
  const std::string saved_from =
      it != contents.metadata.end() && it->second != model.name()
          ? absl::StrCat(" (the file was saved from model '", it->second, "')")
          : "";
  auto model_tensors = ModelTensors(model);
  if (!model_tensors.ok()) return model_tensors.status();
  std::vector<const LoadedTensor*> found;
  for (const auto& [info, values] : *model_tensors) {
    const LoadedTensor* t = contents.Find(info->name);
    if (t == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", info->name, "' of model ",
                                                     model.name(), " is missing", saved_from));
    }
    if (t->shape != info->shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", info->name, "' has shape ", ShapeString(t->shape), " but model ",
                       model.name(), " expects ", ShapeString(info->shape), saved_from));
    }
    found.push_back(t);
  }
  for (size_t i = 0; i < found.size(); ++i) {
    const auto& [info, values] = (*model_tensors)[i];
    std::copy(found[i]->data.begin(), found[i]->data.end(), values->begin() + info->offset);
  }
  return absl::OkStatus();
}

absl::Status LoadModel(const std::string& path, Model& model) {
  auto contents = LoadSafetensors(path);
  if (!contents.ok()) return contents.status();
  return WithPath(path, SetModelWeights(*contents, model));
}

}  // namespace nn
}  // namespace dptrain
