// Models in the safetensors format, so that weights move between dptrain and PyTorch by
// state_dict name. The format itself is common/safetensors.h.
#ifndef DPTRAIN_WORKER_NN_SAFETENSORS_H_
#define DPTRAIN_WORKER_NN_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/safetensors.h"
#include "worker/nn/model.h"

namespace dptrain {
namespace nn {

using ::dptrain::LoadedTensor;
using ::dptrain::NamedTensor;
using ::dptrain::SafetensorsContents;
using ::dptrain::ParseSafetensors;
using ::dptrain::SerializeSafetensors;
using ::dptrain::SaveSafetensors;
using ::dptrain::LoadSafetensors;
using ::dptrain::kMaxSafetensorsHeaderBytes;

// Writes every parameter of `model` under its params() (PyTorch state_dict) name, then every
// buffer (batch norm running statistics) under its buffers() name, with metadata
// {"format": "pt", "model": model.name()}. Takes a non-const Model because weights() is non-const.
absl::Status SaveModel(Model& model, const std::string& path);

// Sets every parameter and buffer of `model` from the tensor of the same name in `contents`
// (buffers are required too, as by PyTorch's strict load_state_dict). Tensors that
// the model does not have are ignored (a fixture may hold inputs or gradients beside the
// weights). Fails, naming the tensor, on a missing name or a shape mismatch, and if the metadata
// names another model; `model` is unchanged on failure.
absl::Status SetModelWeights(const SafetensorsContents& contents, Model& model);

// LoadSafetensors(path), then SetModelWeights; messages start with the path.
absl::Status LoadModel(const std::string& path, Model& model);

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_SAFETENSORS_H_
